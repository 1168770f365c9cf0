"""The web console in a real browser (headless Chromium driven by Selenium) against a real
runtime server: sign-in, runtimes, a live tree with streaming text, approvals answered and
denied, an interrupt, a hostile transcript, another tenant's runtime, and the console's own
defences (CSRF, the session cookie)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from agentruntime.cli.view import cost_text
from agentruntime.v1 import agent_runtime_pb2 as pb
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from tests.support.build import duration
from tests.support.console import ACME, GLOBEX, Stack, cell, driver, row, screenshot, sign_in, stack, until
from tests.support.model_server import Reply, last_tool_output, tool_results
from tests.support.tenants import reply, scripted

__all__ = ["driver", "stack"]  # fixtures of tests/support, used here

STORY = "Streams arrive piece by piece, and the console shows each piece as it comes. " * 3


def streamer(name: str = "writer", text: str = STORY, pause: float = 0.08) -> pb.AgentDef:
    spoken = reply(text, tokens=120)
    spoken.stream_chunk_chars = 6
    spoken.stream_pause.CopyFrom(duration(pause))
    defined = scripted(name, spoken)
    defined.budget.CopyFrom(pb.Budget(max_turns=4, max_tokens=5000))
    return defined


def test_a_wrong_token_is_refused_and_the_right_one_signs_in(driver: WebDriver, stack: Stack) -> None:
    sign_in(driver, stack, "not-a-token", expect="/signin")
    refused = until(driver, lambda d: d.find_elements(By.ID, "signin-error"), "the refusal")
    assert "did not accept" in refused[0].text
    sign_in(driver, stack, ACME[1])
    until(driver, lambda d: d.current_url.endswith("/runtimes"), "the runtimes page")
    cookie = driver.get_cookie("agentruntime_console")
    assert cookie is not None and cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"
    assert ACME[1] not in driver.page_source and ACME[1] not in driver.current_url


def test_the_runtimes_page_lists_the_tenants_runtimes_with_their_figures_and_filters(driver: WebDriver, stack: Stack) -> None:
    spent = stack.create(ACME, "ledger-q3", scripted("counter", reply("counted", tokens=321)))
    stack.wait(ACME, spent, stack.start_run(ACME, spent, "counter", "count"))
    waiting = stack.create(ACME, "ledger-q4", scripted("asker", reply(calls=(("ask", '{"question": "Which quarter?"}'),))))
    stack.wait(ACME, waiting, stack.start_run(ACME, waiting, "asker", "go"))
    stack.create(GLOBEX, "globex-ledger", scripted("counter", reply("theirs")))
    sign_in(driver, stack, ACME[1])
    listed = {r.runtime_id: r for r in stack.rpc(ACME, "ListRuntimes", pb.ListRuntimesRequest()).runtimes}

    driver.get(stack.console_url + "/runtimes")
    rows = {r.get_attribute("data-runtime"): r for r in driver.find_elements(By.CSS_SELECTOR, "#runtimes tbody tr[data-runtime]")}
    assert "globex-ledger" not in rows and {"ledger-q3", "ledger-q4"} <= rows.keys()
    ids = [r.get_attribute("data-runtime") for r in driver.find_elements(By.CSS_SELECTOR, "#runtimes tbody tr[data-runtime]")]
    assert ids == sorted(listed, key=lambda key: listed[key].create_time.ToNanoseconds(), reverse=True)  # newest first
    cells = [c.text for c in rows["ledger-q3"].find_elements(By.TAG_NAME, "td")]
    assert cells[2] == "idle" and cells[6] == f"{listed['ledger-q3'].total_tokens:,}" == "321"
    assert cells[7] == cost_text(listed["ledger-q3"].total_cost) and cells[7].endswith(" USD")
    assert rows["ledger-q4"].find_elements(By.TAG_NAME, "td")[2].text == "waiting"
    screenshot(driver, "runtimes")

    driver.find_element(By.NAME, "q").send_keys("q3")
    driver.find_element(By.CSS_SELECTOR, ".filters button").click()
    until(driver, lambda d: "q=q3" in d.current_url, "the filtered page")
    assert [r.get_attribute("data-runtime") for r in driver.find_elements(By.CSS_SELECTOR, "#runtimes tr[data-runtime]")] == [
        "ledger-q3"
    ]
    driver.get(stack.console_url + "/runtimes?status=waiting")
    shown = [r.get_attribute("data-runtime") for r in driver.find_elements(By.CSS_SELECTOR, "#runtimes tr[data-runtime]")]
    assert "ledger-q4" in shown and "ledger-q3" not in shown

    driver.find_element(By.LINK_TEXT, "ledger-q4").click()
    until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#tree tr[data-id]"), "the runtime's tree")


def test_a_runtimes_tree_is_live_and_a_handles_text_streams_in(driver: WebDriver, stack: Stack) -> None:
    checker = scripted("fact-checker", reply("checked", tokens=35))
    runtime_id = stack.create(ACME, "newsroom", streamer(), scripted("editor", reply("ok", tokens=70)), checker)
    editor = stack.start_run(ACME, runtime_id, "editor", "plan the issue")
    checkers = [
        stack.rpc(ACME, "Spawn", pb.SpawnRequest(runtime_id=runtime_id, parent_id=editor, agent="fact-checker")) for _ in "ab"
    ]
    for spawned in checkers:
        stack.rpc(ACME, "Wake", pb.WakeRequest(runtime_id=runtime_id, handle_id=spawned.handle_id, prompt="check"))
        stack.wait(ACME, runtime_id, spawned.handle_id)
    sign_in(driver, stack, ACME[1])
    driver.get(f"{stack.console_url}/runtimes/{runtime_id}")
    until(driver, lambda d: d.find_element(By.ID, "live-state").text == "live", "the live stream")

    handle_id = stack.start_run(ACME, runtime_id, "writer", "write")
    until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, f'#tree tr[data-id="{handle_id}"]'), "the new handle's row")
    seen: list[str] = []

    def partly_written(d: WebDriver) -> bool:
        text = row(d, handle_id).find_element(By.CLASS_NAME, "writing").get_attribute("textContent") or ""
        if text and text not in seen:
            seen.append(text)
        return 0 < len(text) < len(STORY) and len(seen) >= 2

    until(driver, partly_written, "the text to arrive in pieces")
    assert all(STORY.startswith(piece) for piece in seen), seen  # each a longer beginning of the reply
    screenshot(driver, "runtime-tree")
    result = stack.wait(ACME, runtime_id, handle_id)
    assert result.status == pb.STATUS_DONE and result.text == STORY
    until(driver, lambda d: cell(d, handle_id, "c-total") == f"{result.total_tokens:,}", "the settled figures")
    assert cell(driver, handle_id, "c-turns") == "1" and cell(driver, handle_id, "c-result") == "done"
    assert cell(driver, handle_id, "c-budget") == "turns 4 · tokens 5000"  # (a handle the page had no row for)
    assert not row(driver, handle_id).find_element(By.CLASS_NAME, "writing").is_displayed()  # the turn ended
    ids = [r.get_attribute("data-id") for r in driver.find_elements(By.CSS_SELECTOR, "#tree tr[data-id]")]
    assert ids == [editor, *(spawned.handle_id for spawned in checkers), handle_id]  # parents before their children
    assert cell(driver, editor, "c-total") == f"{70 + 2 * 35:,}"  # its subtree's
    view = stack.rpc(ACME, "Inspect", pb.InspectRequest(runtime_id=runtime_id, handle_id=editor)).handle
    assert cell(driver, editor, "c-cost") == cost_text(view.total_cost) and view.total_cost.micros > view.own_cost.micros


def committer(stack: Stack, name: str) -> pb.AgentDef:
    def commit_then_report(body: dict) -> Reply:  # type: ignore[type-arg]
        if tool_results(body) == 0:
            return Reply(calls=[("commit", {"branch": "main"})], tokens=40)
        return Reply(text="result: " + last_tool_output(body), tokens=40)

    stack.model.script(name, commit_then_report)
    commit = pb.ToolDef(name="commit", description="commits", http=pb.HttpTool(url=stack.tools.url("commit")))
    commit.input_schema.update({"type": "object"})
    commit.approval.CopyFrom(pb.ApprovalPolicy(required=True, prompt="Commit to production?"))
    return pb.AgentDef(name="committer", model=name, tools=[commit])


def test_an_approval_approved_in_the_browser_runs_the_tool_and_the_run_finishes(driver: WebDriver, stack: Stack) -> None:
    runtime_id = stack.create(ACME, "release-approve", committer(stack, "committer-yes"))
    handle_id = stack.start_run(ACME, runtime_id, "committer", "ship it")
    assert stack.wait(ACME, runtime_id, handle_id).status == pb.STATUS_PENDING
    sign_in(driver, stack, ACME[1])
    driver.get(f"{stack.console_url}/runtimes/{runtime_id}")
    form = driver.find_element(By.CSS_SELECTOR, "#requests article.request[data-kind=approval]")
    assert form.find_element(By.CLASS_NAME, "prompt").text.startswith("Commit to production?")
    assert json.loads(form.find_element(By.CLASS_NAME, "arguments").text) == {"branch": "main"}
    screenshot(driver, "approval")
    hits = stack.tools.hits["commit"]
    form.find_element(By.XPATH, ".//button[text()='Approve']").click()
    until(driver, lambda d: "Answer sent" in d.find_element(By.CSS_SELECTOR, "main .flash").text, "the answer's flash")
    result = stack.wait(ACME, runtime_id, handle_id)
    assert (result.status, result.text) == (pb.STATUS_DONE, f"result: commit ok #{hits + 1}")
    assert stack.tools.hits["commit"] == hits + 1
    until(driver, lambda d: cell(d, handle_id, "c-result") == "done", "the tree to show the run finished")
    assert "Nothing waits" in driver.find_element(By.ID, "requests").text


def test_an_approval_denied_from_the_inbox_reaches_the_model_with_its_reason(driver: WebDriver, stack: Stack) -> None:
    runtime_id = stack.create(ACME, "release-deny", committer(stack, "committer-no"))
    handle_id = stack.start_run(ACME, runtime_id, "committer", "ship it")
    assert stack.wait(ACME, runtime_id, handle_id).status == pb.STATUS_PENDING
    hits = stack.tools.hits["commit"]
    sign_in(driver, stack, ACME[1])
    driver.get(stack.console_url + "/inbox")
    form = driver.find_element(By.CSS_SELECTOR, f'#requests article.request[data-request^="{handle_id}/"]')
    form.find_element(By.NAME, "reason").send_keys("change freeze until Monday")
    form.find_element(By.XPATH, ".//button[text()='Deny']").click()
    until(driver, lambda d: "Answer sent" in d.find_element(By.CSS_SELECTOR, "main .flash").text, "the answer's flash")
    assert driver.current_url.endswith("/inbox")
    result = stack.wait(ACME, runtime_id, handle_id)
    assert (result.status, result.text) == (pb.STATUS_DONE, "result: declined by the host: change freeze until Monday")
    assert stack.tools.hits["commit"] == hits  # the tool never ran
    driver.get(f"{stack.console_url}/runtimes/{runtime_id}/transcript?handle={handle_id}")
    tool = driver.find_element(By.CSS_SELECTOR, "#transcript li.message.tool")
    assert "declined by the host: change freeze until Monday" in tool.text and "error" in (tool.get_attribute("class") or "")


def test_an_answer_that_is_not_json_is_not_sent(driver: WebDriver, stack: Stack) -> None:
    asker = scripted("asker", reply(calls=(("ask", '{"question": "Which region?"}'),)), reply("noted", tokens=3))
    runtime_id = stack.create(ACME, "regions", asker)
    handle_id = stack.start_run(ACME, runtime_id, "asker", "deploy")
    assert stack.wait(ACME, runtime_id, handle_id).pending.kind == "input"
    sign_in(driver, stack, ACME[1])
    driver.get(f"{stack.console_url}/runtimes/{runtime_id}")
    form = driver.find_element(By.CSS_SELECTOR, "#requests article.request[data-kind=input]")
    form.find_element(By.CSS_SELECTOR, "input[name=mode][value=json]").click()
    form.find_element(By.NAME, "answer").send_keys('{"region": "eu-west-1"')
    form.find_element(By.XPATH, ".//button[text()='Answer']").click()
    problem = form.find_element(By.CLASS_NAME, "check-error")
    until(driver, lambda d: problem.is_displayed(), "the JSON check")
    assert "not JSON" in problem.text
    assert stack.wait(ACME, runtime_id, handle_id).status == pb.STATUS_PENDING  # nothing was sent
    form.find_element(By.NAME, "answer").send_keys("}")
    form.find_element(By.XPATH, ".//button[text()='Answer']").click()
    until(driver, lambda d: "Answer sent" in d.find_element(By.CSS_SELECTOR, "main .flash").text, "the answer's flash")
    assert stack.wait(ACME, runtime_id, handle_id).status == pb.STATUS_DONE
    transcript = stack.rpc(ACME, "GetTranscript", pb.GetTranscriptRequest(runtime_id=runtime_id, handle_id=handle_id))
    assert json.loads(next(m for m in transcript.messages if m.role == "tool").content) == {"region": "eu-west-1"}


def test_interrupt_stops_a_running_handle_after_a_confirmation(driver: WebDriver, stack: Stack) -> None:
    runtime_id = stack.create(ACME, "slowpoke", scripted("sleeper", reply("late", delay=120)))
    handle_id = stack.start_run(ACME, runtime_id, "sleeper", "sleep")
    sign_in(driver, stack, ACME[1])
    driver.get(f"{stack.console_url}/runtimes/{runtime_id}")
    until(driver, lambda d: cell(d, handle_id, "c-state").startswith("running"), "the running handle")
    row(driver, handle_id).find_element(By.LINK_TEXT, "Interrupt").click()
    until(driver, lambda d: d.find_elements(By.ID, "confirm-interrupt"), "the confirmation")
    assert stack.rpc(ACME, "Inspect", pb.InspectRequest(runtime_id=runtime_id, handle_id=handle_id)).handle.state == (
        pb.HANDLE_STATE_RUNNING
    )  # not before it is confirmed
    driver.find_element(By.ID, "confirm-interrupt").click()
    result = stack.wait(ACME, runtime_id, handle_id)
    assert result.status == pb.STATUS_INTERRUPTED
    until(driver, lambda d: cell(d, handle_id, "c-result") == "interrupted", "the tree to show the interrupt")


def test_a_script_in_a_transcript_stays_text(driver: WebDriver, stack: Stack) -> None:
    hostile = '<script>document.title="pwned"</script><img src=x onerror="document.title=\'pwned\'"> & </pre>'
    runtime_id = stack.create(ACME, "hostile", scripted("mimic", reply(hostile, tokens=9)))
    handle_id = stack.start_run(ACME, runtime_id, "mimic", hostile)
    assert stack.wait(ACME, runtime_id, handle_id).text == hostile
    sign_in(driver, stack, ACME[1])
    driver.get(f"{stack.console_url}/runtimes/{runtime_id}/transcript?handle={handle_id}")
    contents = [element.text for element in driver.find_elements(By.CSS_SELECTOR, "#transcript pre.content")]
    assert contents == [hostile, hostile]  # the prompt and the reply, as written
    assert driver.find_element(By.CSS_SELECTOR, "#result pre.text").text == hostile
    assert driver.find_elements(By.CSS_SELECTOR, "main img, main script") == []
    assert driver.title != "pwned" and "pwned" != driver.execute_script("return document.title")


def test_another_tenants_runtime_reads_as_one_that_does_not_exist(driver: WebDriver, stack: Stack) -> None:
    theirs = stack.create(GLOBEX, "globex-private", scripted("counter", reply("theirs")))
    sign_in(driver, stack, ACME[1])
    pages = {}
    for runtime_id in (theirs, "never-was"):
        driver.get(f"{stack.console_url}/runtimes/{runtime_id}")
        heading = driver.find_element(By.CSS_SELECTOR, "#error h1").text
        pages[runtime_id] = (heading, driver.find_element(By.CSS_SELECTOR, "#error p").text.replace(runtime_id, "ID"))
    assert pages[theirs] == pages["never-was"] and pages[theirs][0] == "Not found", pages
    driver.get(f"{stack.console_url}/runtimes/{theirs}/transcript?handle=root/counter.1")
    assert driver.find_element(By.CSS_SELECTOR, "#error h1").text == "Not found"


def test_an_action_without_the_forms_csrf_token_is_refused_and_changes_nothing(driver: WebDriver, stack: Stack) -> None:
    runtime_id = stack.create(ACME, "guarded", scripted("sleeper", reply("late", delay=120)))
    handle_id = stack.start_run(ACME, runtime_id, "sleeper", "sleep")
    sign_in(driver, stack, ACME[1])
    driver.get(stack.console_url + "/runtimes")
    session = driver.get_cookie("agentruntime_console")
    assert session is not None
    for body, origin in ((f"handle={handle_id}", stack.console_url), (f"handle={handle_id}&csrf=guess", "http://evil.example")):
        request = urllib.request.Request(
            f"{stack.console_url}/runtimes/{runtime_id}/interrupt",
            data=body.encode(),
            headers={"Cookie": f"agentruntime_console={session['value']}", "Origin": origin},
            method="POST",
        )
        try:
            urllib.request.urlopen(request, timeout=10)
            raise AssertionError("the action was taken")
        except urllib.error.HTTPError as error:
            assert error.code == 403
    view = stack.rpc(ACME, "Inspect", pb.InspectRequest(runtime_id=runtime_id, handle_id=handle_id)).handle
    assert view.state == pb.HANDLE_STATE_RUNNING
    stack.rpc(ACME, "Interrupt", pb.InterruptRequest(runtime_id=runtime_id, handle_id=handle_id))


def test_close_closes_a_handle_after_a_confirmation_and_cancel_does_nothing(driver: WebDriver, stack: Stack) -> None:
    runtime_id = stack.create(ACME, "closing", scripted("idler", reply("idle now", tokens=4)))
    handle_id = stack.start_run(ACME, runtime_id, "idler", "go")
    stack.wait(ACME, runtime_id, handle_id)
    sign_in(driver, stack, ACME[1])
    driver.get(f"{stack.console_url}/runtimes/{runtime_id}")
    row(driver, handle_id).find_element(By.LINK_TEXT, "Close").click()
    until(driver, lambda d: d.find_elements(By.ID, "confirm-close"), "the confirmation")
    driver.find_element(By.LINK_TEXT, "Cancel").click()
    until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#tree"), "the runtime again")
    inspect = pb.InspectRequest(runtime_id=runtime_id, handle_id=handle_id)
    assert stack.rpc(ACME, "Inspect", inspect).handle.state == pb.HANDLE_STATE_IDLE
    row(driver, handle_id).find_element(By.LINK_TEXT, "Close").click()
    until(driver, lambda d: d.find_elements(By.ID, "confirm-close"), "the confirmation")
    driver.find_element(By.ID, "confirm-close").click()
    until(driver, lambda d: "Closed" in d.find_element(By.CSS_SELECTOR, "main .flash").text, "the close's flash")
    assert stack.rpc(ACME, "Inspect", inspect).handle.state == pb.HANDLE_STATE_CLOSED
    until(driver, lambda d: cell(d, handle_id, "c-state").startswith("closed"), "the tree to show it closed")


def test_a_page_token_edited_by_hand_is_a_bad_request_not_the_runtimes_fault(driver: WebDriver, stack: Stack) -> None:
    sign_in(driver, stack, ACME[1])
    driver.get(stack.console_url + "/runtimes?page=not-a-token")
    assert driver.find_element(By.CSS_SELECTOR, "#error h1").text == "Not a valid request"

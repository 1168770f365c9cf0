// The agentruntime console's one script: a runtime's tree kept live from /live (server-sent
// events), and answers checked before they are sent. Every text is set with textContent: what a
// model or a tool wrote is never parsed as HTML.
"use strict";

function liveTree(table) {
  const body = table.tBodies[0];
  const template = document.getElementById("row-template");
  const runtimeUrl = table.dataset.runtime;
  const badge = document.getElementById("live-state");
  const rows = new Map();
  for (const row of body.rows) rows.set(row.dataset.id, row);

  function cell(row, name) { return row.querySelector("." + name); }
  function setText(row, name, text) {
    const found = cell(row, name);
    if (found && found.textContent !== text) found.textContent = text;
  }
  function number(value) { return Number(value).toLocaleString("en-US"); }
  function link(action, id) {
    return runtimeUrl + "/confirm?action=" + action + "&handle=" + encodeURIComponent(id);
  }

  function insert(row, id, parent) {
    // After the parent's subtree (spawn order among siblings).
    let after = rows.get(parent) || null;
    if (after) {
      let next = after.nextElementSibling;
      while (next && next.dataset.id.startsWith(parent + "/")) { after = next; next = next.nextElementSibling; }
      after.after(row);
    } else {
      body.appendChild(row);
    }
  }

  function ensure(data) {
    let row = rows.get(data.id);
    if (row) return row;
    row = template.content.firstElementChild.cloneNode(true);
    row.dataset.id = data.id;
    row.dataset.parent = data.parent;
    row.className = "depth-" + Math.min(data.id.split("/").length - 2, 8);
    const name = cell(row, "c-id").querySelector("a");
    name.textContent = data.id.split("/").pop();
    name.href = runtimeUrl + "/transcript?handle=" + encodeURIComponent(data.id);
    cell(row, "c-actions").querySelector(".interrupt").href = link("interrupt", data.id);
    cell(row, "c-actions").querySelector(".close").href = link("close", data.id);
    insert(row, data.id, data.parent);
    rows.set(data.id, row);
    return row;
  }

  function update(data) {
    const row = ensure(data);
    setText(row, "c-agent", data.agent);
    const state = cell(row, "c-state");
    const label = data.activity && data.activity !== data.state ? data.state + " · " + data.activity : data.state;
    if (state.textContent !== label) {
      const span = document.createElement("span");
      span.className = "badge " + data.state;
      span.textContent = label;
      state.replaceChildren(span);
    }
    setText(row, "c-turns", String(data.turns));
    setText(row, "c-own", number(data.own));
    setText(row, "c-total", number(data.total));
    setText(row, "c-cost", data.cost);
    if (data.budget !== undefined) setText(row, "c-budget", data.budget);
    setText(row, "c-result", data.result);
  }

  function writing(id, text) {
    const row = rows.get(id);
    if (!row) return;
    const box = row.querySelector(".writing");
    box.textContent = text;
    box.hidden = text === "";
  }

  function requestIds(root) {
    return Array.from(root.querySelectorAll("article.request"), (article) => article.dataset.request).join("\n");
  }

  let refreshing = null;
  function refreshRequests() {
    const holder = document.getElementById("requests");
    if (!holder || refreshing) return;
    refreshing = fetch(holder.dataset.src, { credentials: "same-origin", headers: { Accept: "text/html" } })
      .then((response) => (response.ok ? response.text() : null))
      .then((html) => {
        if (html === null) return;
        // Rendered by the console with every text escaped (templates/requests.html). The same
        // Requests as shown: left alone, with what a person is typing into their forms.
        const fresh = document.createElement("template");
        fresh.innerHTML = html;
        if (requestIds(fresh.content) === requestIds(holder)) return;
        holder.replaceChildren(fresh.content);
        checkForms(holder);
      })
      .finally(() => { refreshing = null; });
  }

  const source = new EventSource(table.dataset.live);
  source.onopen = () => { badge.textContent = "live"; badge.className = "badge live"; };
  source.onerror = () => { badge.textContent = "reconnecting…"; badge.className = "badge"; };
  source.onmessage = (message) => {
    const data = JSON.parse(message.data);
    if (data.t === "rows") data.rows.forEach(update);
    else if (data.t === "text") writing(data.id, data.text);
    else if (data.t === "requests") refreshRequests();
    else if (data.t === "gone") {
      source.close();
      badge.textContent = "stopped"; badge.className = "badge";
      const gone = document.getElementById("gone");
      gone.textContent = "Live updates stopped: " + data.message;
      gone.hidden = false;
    }
  };
}

function checkForms(root) {
  for (const form of root.querySelectorAll("form[data-check-json]")) {
    form.addEventListener("submit", (event) => {
      const mode = form.querySelector("input[name=mode]:checked");
      const answer = form.querySelector("textarea[name=answer]");
      const problem = form.querySelector(".check-error");
      const decision = event.submitter ? event.submitter.value : "";
      if (!mode || mode.value !== "json" || !answer || decision !== "answer" || answer.value.trim() === "") return;
      let message = "";
      try {
        const value = JSON.parse(answer.value);
        if (value === null || typeof value !== "object" || Array.isArray(value)) message = "The answer must be a JSON object, {…}.";
      } catch (error) {
        message = "The answer is not JSON: " + error.message;
      }
      if (message) {
        event.preventDefault();
        problem.textContent = message;
        problem.hidden = false;
      }
    });
  }
}

document.addEventListener("DOMContentLoaded", () => {
  const table = document.getElementById("tree");
  if (table) liveTree(table);
  checkForms(document);
});

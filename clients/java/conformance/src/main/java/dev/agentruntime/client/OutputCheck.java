package dev.agentruntime.client;

import com.google.gson.annotations.SerializedName;
import com.google.gson.reflect.TypeToken;
import com.google.protobuf.InvalidProtocolBufferException;
import com.google.protobuf.ListValue;
import com.google.protobuf.Value;
import com.google.protobuf.util.JsonFormat;
import dev.agentruntime.v1.Status;
import dev.agentruntime.v1.TaskResult;
import java.util.List;
import java.util.Map;

/**
 * {@link Outputs#outputAs} on results built here (no server): a record and a class with a nested
 * object, a list and an enum decode; whole numbers fit integer fields, 2.5 does not; a value of the
 * wrong JSON kind (a number for a string, a string for a number or a boolean, an unknown enum name,
 * an array for an object) is an {@link OutputException} naming its path; a result without an output
 * is one saying so; a top-level array decodes through a {@code Type}. Run by {@link ClientCheck}.
 */
final class OutputCheck {
  private OutputCheck() {}

  record Verdict(String label, double confidence, List<String> tags) {}

  enum Label { bug, feature, @SerializedName("question") QUESTION }

  static final class Finding {
    String file;
    int line;
    long count;
    boolean fixed;
    Label label;
    Where where;
    List<String> tags = List.of();
  }

  static final class Where {
    int start;
    int end;
  }

  private static void expect(boolean holds, String what) {
    if (!holds) {
      throw new IllegalStateException("outputAs: " + what);
    }
  }

  private static TaskResult done(String json) throws InvalidProtocolBufferException {
    Value.Builder output = Value.newBuilder();
    JsonFormat.parser().merge(json, output);
    return TaskResult.newBuilder().setStatus(Status.STATUS_DONE).setText(json).setOutput(output).build();
  }

  /** The OutputException decoding {@code json} into {@code type} throws; fails when none does. */
  private static OutputException refused(String json, Class<?> type) throws InvalidProtocolBufferException {
    try {
      Object decoded = Outputs.outputAs(done(json), type);
      throw new IllegalStateException("outputAs: " + json + " decoded into " + type.getSimpleName() + ": " + decoded);
    } catch (OutputException e) {
      return e;
    }
  }

  private static void refusedAt(String json, Class<?> type, String path, String reason)
      throws InvalidProtocolBufferException {
    OutputException e = refused(json, type);
    expect(path.equals(e.path()) && e.getMessage().contains(" at " + path + ": ") && e.getMessage().contains(reason),
        json + " into " + type.getSimpleName() + ": path " + e.path() + ", message '" + e.getMessage() + "', want "
            + path + " and '" + reason + "'");
  }

  static String run() throws InvalidProtocolBufferException {
    int checks = 0;
    // The vector's answer into a record.
    Verdict verdict = Outputs.outputAs(done("{\"label\": \"bug\", \"confidence\": 0.75, \"tags\": [\"crash\", \"ui\"]}"),
        Verdict.class);
    expect(verdict.equals(new Verdict("bug", 0.75, List.of("crash", "ui"))), "record: " + verdict);
    checks++;
    // A class: whole numbers (a Value's are doubles) into int and long, a nested object, an enum by
    // name and by @SerializedName, a field the output lacks keeps its initializer, an unknown key is ignored.
    Finding finding = Outputs.outputAs(done("{\"file\": \"a.py\", \"line\": 12, \"count\": 9007199254740992,"
        + " \"fixed\": true, \"label\": \"question\", \"where\": {\"start\": 3, \"end\": 4}, \"extra\": 1}"), Finding.class);
    expect("a.py".equals(finding.file) && finding.line == 12 && finding.count == 9007199254740992L && finding.fixed
        && finding.label == Label.QUESTION && finding.where.start == 3 && finding.where.end == 4
        && finding.tags.isEmpty(), "class: " + Outputs.outputJson(done("{}")) + " / line " + finding.line);
    checks++;
    Finding enumByName = Outputs.outputAs(done("{\"label\": \"feature\"}"), Finding.class);
    expect(enumByName.label == Label.feature && enumByName.where == null, "enum by name: " + enumByName.label);
    checks++;
    // outputJson: whole numbers without a fraction.
    String json = Outputs.outputJson(done("{\"n\": 2.0, \"big\": 1e20, \"x\": 0.5, \"s\": \"\\u00e9\\\"\"}"));
    expect(json.equals("{\"n\":2,\"big\":100000000000000000000,\"x\":0.5,\"s\":\"\u00e9\\\"\"}"), "outputJson: " + json);
    checks++;

    // Misfits name their path.
    refusedAt("{\"line\": 2.5}", Finding.class, "$.line", "2.5");
    refusedAt("{\"where\": {\"start\": 1, \"end\": 1.5}}", Finding.class, "$.where.end", "1.5");
    refusedAt("{\"line\": 1e20}", Finding.class, "$.line", "100000000000000000000");
    refusedAt("{\"label\": \"bug\", \"confidence\": \"high\", \"tags\": []}", Verdict.class, "$.confidence",
        "expected a number but was a string");
    refusedAt("{\"label\": 5, \"confidence\": 1, \"tags\": []}", Verdict.class, "$.label",
        "expected a string but was a number");
    refusedAt("{\"label\": \"bug\", \"confidence\": 1, \"tags\": [\"a\", 2]}", Verdict.class, "$.tags[1]",
        "expected a string but was a number");
    refusedAt("{\"label\": \"bug\", \"confidence\": 1, \"tags\": \"a\"}", Verdict.class, "$.tags",
        "Expected BEGIN_ARRAY but was STRING");
    refusedAt("{\"fixed\": \"yes\"}", Finding.class, "$.fixed", "expected a boolean but was a string");
    refusedAt("{\"label\": \"other\"}", Finding.class, "$.label", "expected one of Label's names but was \"other\"");
    refusedAt("{\"where\": [1, 2]}", Finding.class, "$.where", "Expected BEGIN_OBJECT but was BEGIN_ARRAY");
    refusedAt("[1]", Verdict.class, "$", "Expected BEGIN_OBJECT but was BEGIN_ARRAY");
    checks += 11;

    // No output: another status, or an agent without a schema.
    for (TaskResult none : List.of(
        TaskResult.newBuilder().setStatus(Status.STATUS_INCOMPLETE).setText("It is a bug, I think.").build(),
        TaskResult.newBuilder().setStatus(Status.STATUS_DONE).setText("plain text").build())) {
      try {
        Outputs.outputAs(none, Verdict.class);
        throw new IllegalStateException("outputAs: a result without an output decoded");
      } catch (OutputException e) {
        expect(e.path() == null && e.getMessage().startsWith("the result has no output (status " + none.getStatus().name()),
            "no output: " + e.getMessage());
      }
      checks++;
    }
    // A non-finite number (a Value can hold one; JSON cannot).
    TaskResult infinite = TaskResult.newBuilder().setStatus(Status.STATUS_DONE).setOutput(Value.newBuilder()
        .setListValue(ListValue.newBuilder().addValues(Value.newBuilder().setNumberValue(Double.POSITIVE_INFINITY))))
        .build();
    try {
      Outputs.outputAs(infinite, Object.class);
      throw new IllegalStateException("outputAs: Infinity decoded");
    } catch (OutputException e) {
      expect("$[0]".equals(e.path()), "Infinity: " + e.getMessage());
    }
    checks++;

    // A top-level array through a Type.
    List<Map<String, Integer>> rows = Outputs.outputAs(done("[{\"a\": 1}, {\"b\": 2}]"),
        new TypeToken<List<Map<String, Integer>>>() {}.getType());
    expect(rows.equals(List.of(Map.of("a", 1), Map.of("b", 2))), "Type: " + rows);
    checks++;
    return "outputAs: " + checks + " checks (records, classes, enums, whole numbers, misfits by path, no output)";
  }
}

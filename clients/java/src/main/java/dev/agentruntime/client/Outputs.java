package dev.agentruntime.client;

import com.google.gson.Gson;
import com.google.gson.GsonBuilder;
import com.google.gson.JsonParseException;
import com.google.gson.JsonPrimitive;
import com.google.gson.Strictness;
import com.google.gson.TypeAdapter;
import com.google.gson.TypeAdapterFactory;
import com.google.gson.reflect.TypeToken;
import com.google.gson.stream.JsonReader;
import com.google.gson.stream.JsonToken;
import com.google.gson.stream.JsonWriter;
import com.google.protobuf.Value;
import dev.agentruntime.v1.TaskResult;
import java.io.IOException;
import java.io.StringReader;
import java.io.StringWriter;
import java.lang.reflect.Type;
import java.math.BigDecimal;
import java.math.BigInteger;
import java.util.Map;
import java.util.Set;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * Typed results: {@link #outputAs} decodes a {@link TaskResult}'s structured output (set when the
 * agent has an {@code output_schema} and the run is {@code STATUS_DONE}; the server has already
 * validated it against the schema) into a class or record of the caller's, with Gson.
 *
 * <pre>{@code
 * record Verdict(String label, double confidence, List<String> tags) {}
 *
 * Verdict verdict = Outputs.outputAs(client.run(runtimeId, "classifier", prompt), Verdict.class);
 * }</pre>
 *
 * <p>Stricter than Gson's defaults: a string field takes only a JSON string, a number field only a
 * JSON number (an integer field only a whole one: {@code 2.5} into an {@code int} is an error,
 * {@code 2} or {@code 2.0} is not), a boolean field only {@code true} or {@code false}, and an enum
 * field only one of its constants' names (Gson's {@code @SerializedName} counts). Keys the type has
 * no field for are ignored, and a field the output lacks keeps its default ({@code null}, 0): the
 * schema's {@code required} and {@code additionalProperties} are what the server enforces.
 */
public final class Outputs {
  private Outputs() {}

  private static final Set<Class<?>> STRINGS = Set.of(String.class, char.class, Character.class);
  private static final Set<Class<?>> NUMBERS = Set.of(int.class, Integer.class, long.class, Long.class,
      short.class, Short.class, byte.class, Byte.class, double.class, Double.class, float.class, Float.class,
      BigDecimal.class, BigInteger.class, Number.class);
  private static final Set<Class<?>> BOOLEANS = Set.of(boolean.class, Boolean.class);

  /** The JSON path Gson's messages end with ("... at line 1 column 16 path $.x"), and the reason before it. */
  private static final Pattern GSON_MESSAGE =
      Pattern.compile("^(?:[\\w.$]+(?:Exception|Error): )?(.*?);?(?: at line \\d+ column \\d+)?(?: at)? path (\\$\\S*)");

  private static final Gson GSON = new GsonBuilder()
      .registerTypeAdapterFactory(new StrictScalars())
      .disableJdkUnsafe() // a class without a no-argument constructor is an error, not an object built around it
      .create();

  /**
   * The result's output decoded into {@code type}.
   *
   * @throws OutputException the result has no output (another status than {@code STATUS_DONE},
   *     or an agent without an {@code output_schema}), or it does not fit {@code type}: the
   *     exception's {@link OutputException#path() path} says where
   */
  public static <T> T outputAs(TaskResult result, Class<T> type) {
    return decode(result, type, type.getSimpleName());
  }

  /**
   * The result's output decoded into a generic type, e.g.
   * {@code new TypeToken<List<Finding>>() {}.getType()} for an output schema whose top is an array.
   *
   * @throws OutputException as {@link #outputAs(TaskResult, Class)}
   */
  public static <T> T outputAs(TaskResult result, Type type) {
    return decode(result, type, type.getTypeName());
  }

  /**
   * The result's output as JSON text (numbers as the server's JSON has them: whole ones without a
   * fraction), for a decoder of the caller's choosing.
   *
   * @throws OutputException the result has no output
   */
  public static String outputJson(TaskResult result) {
    return json(present(result));
  }

  private static Value present(TaskResult result) {
    if (!result.hasOutput() || result.getOutput().getKindCase() == Value.KindCase.KIND_NOT_SET) {
      throw new OutputException("the result has no output (status " + result.getStatus().name()
          + "; only a STATUS_DONE result of an agent with an output_schema has one)", null, null);
    }
    return result.getOutput();
  }

  private static <T> T decode(TaskResult result, Type type, String typeName) {
    String json = json(present(result));
    JsonReader reader = new JsonReader(new StringReader(json));
    reader.setStrictness(Strictness.STRICT);
    try {
      TypeAdapter<?> adapter = GSON.getAdapter(TypeToken.get(type));
      @SuppressWarnings("unchecked")
      T decoded = (T) adapter.read(reader);
      return decoded;
    } catch (Misfit e) {
      throw misfit(typeName, e.path, e.reason, e);
    } catch (JsonParseException | IllegalStateException | NumberFormatException | IOException e) {
      String message = String.valueOf(e.getMessage()).lines().findFirst().orElse("");
      Matcher at = GSON_MESSAGE.matcher(message);
      if (at.find()) {
        throw misfit(typeName, at.group(2), at.group(1), e);
      }
      throw misfit(typeName, reader.getPath(), message, e);
    }
  }

  private static OutputException misfit(String typeName, String path, String reason, Throwable cause) {
    return new OutputException("the output does not fit " + typeName + " at " + path + ": " + reason, path, cause);
  }

  /** The Value as JSON text; a whole number is written without a fraction (2, not 2.0). */
  static String json(Value value) {
    StringWriter out = new StringWriter();
    try (JsonWriter writer = new JsonWriter(out)) {
      writer.setStrictness(Strictness.STRICT);
      write(writer, value, "$");
    } catch (IOException e) {
      throw new IllegalStateException(e); // a StringWriter does not fail
    }
    return out.toString();
  }

  private static void write(JsonWriter writer, Value value, String path) throws IOException {
    switch (value.getKindCase()) {
      case NULL_VALUE, KIND_NOT_SET -> writer.nullValue();
      case BOOL_VALUE -> writer.value(value.getBoolValue());
      case STRING_VALUE -> writer.value(value.getStringValue());
      case NUMBER_VALUE -> {
        double number = value.getNumberValue();
        if (!Double.isFinite(number)) {
          throw new OutputException("the output holds " + number + " at " + path + ", which JSON has no number for",
              path, null);
        }
        if (number == Math.rint(number)) {
          writer.value(new BigDecimal(number).toBigInteger()); // exact, however large
        } else {
          writer.value(number);
        }
      }
      case STRUCT_VALUE -> {
        writer.beginObject();
        for (Map.Entry<String, Value> field : value.getStructValue().getFieldsMap().entrySet()) {
          writer.name(field.getKey());
          write(writer, field.getValue(), path + "." + field.getKey());
        }
        writer.endObject();
      }
      case LIST_VALUE -> {
        writer.beginArray();
        int index = 0;
        for (Value item : value.getListValue().getValuesList()) {
          write(writer, item, path + "[" + index++ + "]");
        }
        writer.endArray();
      }
    }
  }

  private static String describe(JsonToken token) {
    return switch (token) {
      case BEGIN_OBJECT -> "an object";
      case BEGIN_ARRAY -> "an array";
      case STRING -> "a string";
      case NUMBER -> "a number";
      case BOOLEAN -> "a boolean";
      default -> token.name();
    };
  }

  /** A value of the wrong JSON kind for its field, at a path. */
  private static final class Misfit extends JsonParseException {
    private static final long serialVersionUID = 1L;
    final String path;
    final String reason;

    Misfit(String path, String reason) {
      super(reason + " at path " + path);
      this.path = path;
      this.reason = reason;
    }
  }

  /**
   * Gson's own adapters for strings, numbers, booleans and enums, behind a check of the JSON
   * token: Gson alone reads 5 into a String field, "0.5" into a double, "yes" into a boolean
   * (false) and an unknown name into an enum (null).
   */
  private static final class StrictScalars implements TypeAdapterFactory {
    @Override
    public <T> TypeAdapter<T> create(Gson gson, TypeToken<T> token) {
      Class<? super T> raw = token.getRawType();
      JsonToken wanted;
      String kind;
      if (STRINGS.contains(raw)) {
        wanted = JsonToken.STRING;
        kind = "a string";
      } else if (NUMBERS.contains(raw)) {
        wanted = JsonToken.NUMBER;
        kind = "a number";
      } else if (BOOLEANS.contains(raw)) {
        wanted = JsonToken.BOOLEAN;
        kind = "a boolean";
      } else if (raw.isEnum() || (raw.getSuperclass() != null && raw.getSuperclass().isEnum())) {
        wanted = JsonToken.STRING;
        kind = "one of " + raw.getSimpleName() + "'s names";
      } else {
        return null;
      }
      TypeAdapter<T> delegate = gson.getDelegateAdapter(this, token);
      boolean isEnum = wanted == JsonToken.STRING && !STRINGS.contains(raw);
      return new TypeAdapter<T>() {
        @Override
        public void write(JsonWriter out, T value) throws IOException {
          delegate.write(out, value);
        }

        @Override
        public T read(JsonReader in) throws IOException {
          JsonToken got = in.peek();
          if (got == JsonToken.NULL) {
            return delegate.read(in);
          }
          String path = in.getPath();
          if (got != wanted) {
            throw new Misfit(path, "expected " + kind + " but was " + describe(got));
          }
          if (!isEnum) {
            return delegate.read(in);
          }
          String name = in.nextString();
          T constant = delegate.fromJsonTree(new JsonPrimitive(name));
          if (constant == null) {
            throw new Misfit(path, "expected " + kind + " but was " + new JsonPrimitive(name));
          }
          return constant;
        }
      };
    }
  }
}

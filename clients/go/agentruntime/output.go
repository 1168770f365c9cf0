package agentruntime

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protojson"

	v1 "github.com/agentruntime/agentruntime/clients/go/agentruntime/v1"
)

// ErrNoOutput is DecodeOutput's error (wrapped, with the result's status) for a result
// without an output: only a STATUS_DONE result of an agent with an output_schema has one.
var ErrNoOutput = errors.New("agentruntime: the result has no output")

// OutputError is DecodeOutput's error for an output that does not fit the value decoded
// into: Path is where, "$" for the whole output and "$.confidence" or "$.items.name" for a
// field (encoding/json's UnmarshalTypeError.Field: struct fields from the top, dotted,
// without list indexes or map keys); an unknown field is reported at "$", its name in Err.
type OutputError struct {
	Path string
	Err  error
}

func (e *OutputError) Error() string {
	return fmt.Sprintf("agentruntime: the output does not fit at %s: %v", e.Path, e.Err)
}

func (e *OutputError) Unwrap() error { return e.Err }

// DecodeOutput decodes the result's output (TaskResult.output, the agent's answer as the
// runtime validated it against the agent's output_schema) into v, a pointer, typically to
// a struct with json tags:
//
//	var c struct {
//		Label      string   `json:"label"`
//		Confidence float64  `json:"confidence"`
//		Tags       []string `json:"tags"`
//	}
//	if err := agentruntime.DecodeOutput(result, &c); err != nil { ... }
//
// The output goes through protojson and then encoding/json with DisallowUnknownFields, so
// a field v does not have is an error, as is a value of the wrong type (an *OutputError
// naming the path). A field the output lacks keeps v's value. A result without an output
// (not DONE, or its agent has no output_schema) is ErrNoOutput.
func DecodeOutput(result *v1.TaskResult, v any) error {
	output := result.GetOutput()
	if output == nil {
		return fmt.Errorf("%w (status %s; only a STATUS_DONE result of an agent with an output_schema has one)",
			ErrNoOutput, result.GetStatus())
	}
	data, err := protojson.Marshal(output)
	if err != nil {
		return fmt.Errorf("agentruntime: the output is not JSON: %w", err)
	}
	decoder := json.NewDecoder(bytes.NewReader(data))
	decoder.DisallowUnknownFields()
	err = decoder.Decode(v)
	var invalid *json.InvalidUnmarshalError
	var mistyped *json.UnmarshalTypeError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &invalid):
		return fmt.Errorf("agentruntime: DecodeOutput needs a non-nil pointer: %w", err)
	case errors.As(err, &mistyped) && mistyped.Field != "":
		return &OutputError{Path: "$." + mistyped.Field, Err: err}
	default:
		return &OutputError{Path: "$", Err: err}
	}
}

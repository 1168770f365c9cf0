package agentruntime

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"

	v1 "github.com/agentruntime/agentruntime/clients/go/agentruntime/v1"
)

type classification struct {
	Label      string   `json:"label"`
	Confidence float64  `json:"confidence"`
	Tags       []string `json:"tags"`
}

// done is a DONE result whose output is value (as structpb.NewValue takes it).
func done(t *testing.T, value any) *v1.TaskResult {
	t.Helper()
	output, err := structpb.NewValue(value)
	if err != nil {
		t.Fatal(err)
	}
	return &v1.TaskResult{Status: v1.Status_STATUS_DONE, Output: output}
}

func TestDecodeOutputFillsAStruct(t *testing.T) {
	result := done(t, map[string]any{"label": "bug", "confidence": 0.75, "tags": []any{"crash", "ui"}})
	var got classification
	if err := DecodeOutput(result, &got); err != nil {
		t.Fatal(err)
	}
	want := classification{Label: "bug", Confidence: 0.75, Tags: []string{"crash", "ui"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v, want %+v", got, want)
	}
}

func TestDecodeOutputTakesAnyJSONShape(t *testing.T) {
	var list []int
	if err := DecodeOutput(done(t, []any{1, 2, 3}), &list); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(list, []int{1, 2, 3}) {
		t.Errorf("list = %v", list)
	}
	var plain any
	if err := DecodeOutput(done(t, map[string]any{"n": 2.5, "ok": true, "none": nil}), &plain); err != nil {
		t.Fatal(err)
	}
	if want := map[string]any{"n": 2.5, "ok": true, "none": nil}; !reflect.DeepEqual(plain, want) {
		t.Errorf("plain = %v, want %v", plain, want)
	}
}

func TestDecodeOutputNamesThePathThatDoesNotFit(t *testing.T) {
	type item struct {
		Count int `json:"count"`
	}
	type nested struct {
		Items []item `json:"items"`
	}
	for _, c := range []struct {
		name   string
		output any
		into   any
		path   string
		reason string
	}{
		{"a string for a number", map[string]any{"label": "bug", "confidence": "high", "tags": []any{}}, &classification{}, "$.confidence", "string"},
		{"a number in a list of strings", map[string]any{"tags": []any{"ui", 3}}, &classification{}, "$.tags", "number"},
		{"a fraction for an int, in a list", map[string]any{"items": []any{map[string]any{"count": 1.5}}}, &nested{}, "$.items.count", "1.5"},
		{"a field the struct does not have", map[string]any{"label": "bug", "severity": "high"}, &classification{}, "$", `unknown field "severity"`},
		{"a list for a struct", []any{"bug"}, &classification{}, "$", "array"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := DecodeOutput(done(t, c.output), c.into)
			var outErr *OutputError
			if !errors.As(err, &outErr) {
				t.Fatalf("want *OutputError, got %T %v", err, err)
			}
			if outErr.Path != c.path {
				t.Errorf("Path = %q, want %q (%v)", outErr.Path, c.path, err)
			}
			if !strings.Contains(err.Error(), c.reason) || !strings.Contains(err.Error(), c.path) {
				t.Errorf("Error() = %q, want it to name %s and %q", err, c.path, c.reason)
			}
		})
	}
}

func TestDecodeOutputWithoutAnOutput(t *testing.T) {
	for _, result := range []*v1.TaskResult{
		{Status: v1.Status_STATUS_INCOMPLETE, Limit: v1.Limit_LIMIT_COMPLETION, Text: "It is a bug, I think."},
		{Status: v1.Status_STATUS_DONE, Text: "an agent without an output_schema"},
		nil,
	} {
		var got classification
		err := DecodeOutput(result, &got)
		if !errors.Is(err, ErrNoOutput) {
			t.Fatalf("want ErrNoOutput, got %v", err)
		}
		if want := result.GetStatus().String(); !strings.Contains(err.Error(), want) {
			t.Errorf("Error() = %q, want it to name %s", err, want)
		}
	}
}

func TestDecodeOutputNeedsAPointer(t *testing.T) {
	var got classification
	err := DecodeOutput(done(t, map[string]any{"label": "bug"}), got)
	var outErr *OutputError
	if err == nil || errors.As(err, &outErr) {
		t.Fatalf("want a plain error for a non-pointer, got %T %v", err, err)
	}
}

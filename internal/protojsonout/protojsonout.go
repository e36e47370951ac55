// Package protojsonout is the JSON every `--json` of the trainmeter CLI
// prints, and the web console shows: protobuf messages with their .proto
// field names, unset numbers as 0, every number a JSON number. protojson
// writes 64-bit integers as strings (the proto3 JSON mapping, for
// JavaScript's 53-bit numbers) and NaN/Infinity as strings; a user's jq or
// pandas wants numbers, so 64-bit integers become numbers, and non-finite
// floats and unset optional figures null (unknown, as an empty CSV cell).
package protojsonout

import (
	"bytes"
	"encoding/json"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Indented is m's JSON, indented, without a trailing newline; strings are
// not HTML-escaped (a run id "<a>" reads as itself).
func Indented(m proto.Message) ([]byte, error) {
	v, err := Value(m)
	if err != nil {
		return nil, err
	}
	return encode(v, "  ")
}

// Field is one top-level field of a message: its .proto name and its value
// as compact JSON text (strings not HTML-escaped).
type Field struct{ Name, Value string }

// Fields is m's top-level fields in .proto order.
func Fields(m proto.Message) ([]Field, error) {
	v, err := Value(m)
	if err != nil {
		return nil, err
	}
	obj, ok := v.(*orderedObject)
	if !ok {
		return nil, nil
	}
	var out []Field
	for _, k := range obj.keys {
		b, err := encode(obj.vals[k], "")
		if err != nil {
			return nil, err
		}
		out = append(out, Field{k, string(b)})
	}
	return out, nil
}

// encode is v's JSON, indented by indent, strings not HTML-escaped, without
// the encoder's trailing newline.
func encode(v any, indent string) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", indent)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}

// Value is m as protojson writes it, decoded, with the numbers fixed: a
// value for encoding/json whose objects keep the .proto field order.
func Value(m proto.Message) (any, error) {
	b, err := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}.Marshal(m)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return fixMessage(m.ProtoReflect().Descriptor(), v), nil
}

func fixMessage(md protoreflect.MessageDescriptor, v any) any {
	obj, ok := v.(map[string]any)
	if !ok {
		return v // a well-known type written as a string (Timestamp, Duration)
	}
	out := &orderedObject{vals: obj}
	// protojson writes exactly md's fields (EmitUnpopulated; no Any, Struct
	// or extension in trainmeter's messages), so md's order covers every key.
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		val, ok := obj[string(fd.Name())]
		if !ok {
			if !fd.HasOptionalKeyword() || fd.Kind() == protoreflect.MessageKind {
				continue
			}
			// An unset optional figure is unknown: null, so that every
			// report has the same keys (protojson leaves it out).
			obj[string(fd.Name())], val = nil, nil
		}
		out.keys = append(out.keys, string(fd.Name()))
		if val == nil {
			continue
		}
		switch {
		case fd.IsMap():
			if mm, ok := val.(map[string]any); ok {
				for k, e := range mm {
					mm[k] = fixScalar(fd.MapValue(), e)
				}
			}
		case fd.IsList():
			if l, ok := val.([]any); ok {
				for j, e := range l {
					l[j] = fixScalar(fd, e)
				}
			}
		default:
			obj[string(fd.Name())] = fixScalar(fd, val)
		}
	}
	return out
}

// orderedObject is a JSON object written in keys' order.
type orderedObject struct {
	keys []string
	vals map[string]any
}

func (o *orderedObject) MarshalJSON() ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteByte('{')
	for i, k := range o.keys {
		if i > 0 {
			buf.WriteByte(',')
		}
		kb, err := json.Marshal(k)
		if err != nil {
			return nil, err
		}
		buf.Write(kb)
		buf.WriteByte(':')
		vb, err := json.Marshal(o.vals[k])
		if err != nil {
			return nil, err
		}
		buf.Write(vb)
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}

func fixScalar(fd protoreflect.FieldDescriptor, v any) any {
	switch fd.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return fixMessage(fd.Message(), v)
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind,
		protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		if s, ok := v.(string); ok {
			return json.Number(s)
		}
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		if _, ok := v.(string); ok { // "NaN", "Infinity", "-Infinity"
			return nil
		}
	}
	return v
}

package cli

import (
	"fmt"
	"io"

	"google.golang.org/protobuf/proto"

	"github.com/trainmeter/trainmeter/internal/protojsonout"
)

// writeProtoJSON is every command's --json (package protojsonout: field
// names as in the .proto files and the CSV, every number a JSON number).
func writeProtoJSON(w io.Writer, m proto.Message) error {
	b, err := protojsonout.Indented(m)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(w, string(b))
	return err
}

// show prints a collector's answer resp (err: the call's error): as JSON
// with --json, else with text.
func show[M proto.Message](w io.Writer, asJSON bool, resp M, err error, text func(io.Writer) error) error {
	if err != nil {
		return err
	}
	if asJSON {
		return writeProtoJSON(w, resp)
	}
	return text(w)
}

package cli

import (
	"fmt"
	"io"

	"google.golang.org/protobuf/proto"

	"github.com/trainmeter/trainmeter/internal/protojsonout"
)

// show prints a collector's answer resp (err: the call's error): as JSON
// with --json (package protojsonout: field names as in the .proto files
// and the CSV, every number a JSON number), else with text.
func show[M proto.Message](w io.Writer, asJSON bool, resp M, err error, text func(io.Writer) error) error {
	if err != nil {
		return err
	}
	if !asJSON {
		return text(w)
	}
	b, err := protojsonout.Indented(resp)
	if err == nil {
		_, err = fmt.Fprintln(w, string(b))
	}
	return err
}

package spool

import "fmt"

// formatVersion is the spool format this agent writes and reads: the state
// file's "version" and the digit that ends each segment's magic. The ack
// log has no header of its own; it is read only beside a state file of
// this version.
const formatVersion = 1

// FormatError refuses files written in a format this agent does not read
// (a newer agent's, say). Reading them as corrupt would discard them and
// writing beside them would mix two formats, so they are left as they are;
// restarting cannot cure it, a person decides.
type FormatError struct {
	// What names the refused thing ("spool dir DIR", "ledger state FILE"),
	// File the file that carries the version when What is a directory.
	What, File string
	// Format names the format ("spool", "ledger state"); Have is the
	// version found, Want the one this agent reads.
	Format     string
	Have, Want uint32
	// Lost says what moving it aside gives up.
	Lost string
}

func (e *FormatError) Error() string {
	what := e.What
	if e.File != "" {
		what += " (" + e.File + ")"
	}
	return fmt.Sprintf("%s was written by %s format %d, this agent reads %d: move it aside (%s) or run the agent that wrote it",
		what, e.Format, e.Have, e.Want, e.Lost)
}

func (s *Spool) formatError(file string, have uint32) error {
	return &FormatError{What: "spool dir " + s.dir, File: file, Format: "spool", Have: have, Want: formatVersion,
		Lost: "its unsent batches are lost"}
}

package store

import (
	"errors"

	"github.com/trainmeter/trainmeter/collector/internal/storage"
)

// Store is the collector's storage.Store on BadgerDB; the seam's words are
// its own.
var _ storage.Store = (*Store)(nil)

// ErrNotFound is returned for an unknown run or record.
var ErrNotFound = storage.ErrNotFound

// ErrBatchTooLarge is returned when a batch does not fit in one transaction.
var ErrBatchTooLarge = storage.ErrBatchTooLarge

type (
	NotFoundError = storage.NotFoundError
	Sender        = storage.Sender
	Refusal       = storage.Refusal
	Applied       = storage.Applied
	NodeWindow    = storage.NodeWindow
	NodeEvent     = storage.NodeEvent
)

// ErrLocked is returned by Open for a data directory another process holds
// open: a collector running on it, or a migrate reading it.
var ErrLocked = errors.New("in use by another process (a collector running on it?)")

package store

import (
	"bytes"
	"errors"
	"fmt"
	"strings"

	"github.com/dgraph-io/badger/v4"
)

// Records (storage.Records) are kept under x/<namespace>\0<key>.

func recordKey(ns, k string) []byte { return key("x/", ns, k) }

func checkNamespace(ns string) error {
	if ns == "" || strings.IndexByte(ns, 0) >= 0 {
		return fmt.Errorf("store: invalid record namespace %q", ns)
	}
	return nil
}

// PutRecord implements storage.Records (as do the methods below).
func (s *Store) PutRecord(ns, k string, v []byte) error {
	return s.PutRecords(ns, map[string][]byte{k: v})
}

func (s *Store) PutRecords(ns string, kv map[string][]byte) error {
	if err := checkNamespace(ns); err != nil {
		return err
	}
	return s.db.Update(func(txn *badger.Txn) error {
		for k, v := range kv {
			if err := txn.Set(recordKey(ns, k), v); err != nil {
				return err
			}
		}
		return nil
	})
}

// PutRecordIfAbsent: badger's optimistic transactions detect two callers
// racing for one key.
func (s *Store) PutRecordIfAbsent(ns, k string, v []byte) (bool, error) {
	if err := checkNamespace(ns); err != nil {
		return false, err
	}
	for range maxConflictRetries {
		wrote := false
		err := s.db.Update(func(txn *badger.Txn) error {
			_, err := txn.Get(recordKey(ns, k))
			if err == nil {
				return nil
			}
			if !errors.Is(err, badger.ErrKeyNotFound) {
				return err
			}
			wrote = true
			return txn.Set(recordKey(ns, k), v)
		})
		if errors.Is(err, badger.ErrConflict) {
			continue
		}
		return wrote && err == nil, err
	}
	return false, fmt.Errorf("store: record %s/%s: too many conflicts", ns, k)
}

func (s *Store) GetRecord(ns, k string) ([]byte, error) {
	if err := checkNamespace(ns); err != nil {
		return nil, err
	}
	var out []byte
	err := s.db.View(func(txn *badger.Txn) error {
		it, err := txn.Get(recordKey(ns, k))
		if errors.Is(err, badger.ErrKeyNotFound) {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		out, err = it.ValueCopy(nil)
		return err
	})
	return out, err
}

func (s *Store) DeleteRecord(ns, k string) error {
	if err := checkNamespace(ns); err != nil {
		return err
	}
	return s.db.Update(func(txn *badger.Txn) error { return txn.Delete(recordKey(ns, k)) })
}

func (s *Store) ScanRecords(ns, keyPrefix string, fn func(k string, v []byte) (bool, error)) error {
	if err := checkNamespace(ns); err != nil {
		return err
	}
	base := key("x/", ns, "")
	prefix := append(bytes.Clone(base), keyPrefix...)
	return s.db.View(func(txn *badger.Txn) error {
		return scan(txn, badger.IteratorOptions{Prefix: prefix, PrefetchSize: 100}, nil, func(k, v []byte) error {
			more, err := fn(string(k[len(base):]), v)
			if err == nil && !more {
				return errStop
			}
			return err
		})
	})
}

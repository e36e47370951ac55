package pgstore

import (
	"context"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
)

// leaderLockKey is the advisory lock key of the fleet's leader
// (package leader).
const leaderLockKey = 0x74726d6c65616465 // "trmleade"

// LeaderLock is the fleet's leader lock on this store's database
// (leader.Lock): a session-level advisory lock on a connection of its own,
// outside the pool, so that it lasts exactly as long as that session.
func (s *Store) LeaderLock() *AdvisoryLock {
	return &AdvisoryLock{cfg: s.pool.Config().ConnConfig, key: leaderLockKey}
}

// AdvisoryLock is a session-level PostgreSQL advisory lock held on a
// dedicated connection. While held, a goroutine waits on that connection:
// its read ends as soon as the session does (the server went away, or an
// administrator terminated the backend), which closes the lost channel.
type AdvisoryLock struct {
	cfg *pgx.ConnConfig
	key int64

	mu     sync.Mutex
	cancel context.CancelFunc // ends the wait (nil: not held)
	lost   chan struct{}
}

// TryLock connects and takes the lock with pg_try_advisory_lock; held
// elsewhere, it closes the connection and returns nil.
func (l *AdvisoryLock) TryLock(ctx context.Context) (<-chan struct{}, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lost != nil {
		select {
		case <-l.lost:
		default:
			return l.lost, nil // still held
		}
	}
	conn, err := pgx.ConnectConfig(ctx, l.cfg.Copy())
	if err != nil {
		return nil, fmt.Errorf("pgstore: leader lock: connect: %w", err)
	}
	var got bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", l.key).Scan(&got); err != nil || !got {
		_ = conn.Close(context.Background())
		if err != nil {
			return nil, fmt.Errorf("pgstore: leader lock: %w", err)
		}
		return nil, nil
	}
	wctx, cancel := context.WithCancel(context.Background())
	lost := make(chan struct{})
	go func() {
		defer close(lost)
		// Nothing LISTENs on this session: the wait returns only when the
		// session ends or Unlock cancels it. Closing the connection then
		// releases the lock, if the server still has it.
		for conn.PgConn().WaitForNotification(wctx) == nil {
		}
		_ = conn.Close(context.Background())
	}()
	l.cancel, l.lost = cancel, lost
	return lost, nil
}

// Unlock ends the lock's session (which releases the lock) and waits
// until the connection is closed or ctx ends.
func (l *AdvisoryLock) Unlock(ctx context.Context) error {
	l.mu.Lock()
	cancel, lost := l.cancel, l.lost
	l.cancel, l.lost = nil, nil
	l.mu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	select {
	case <-lost:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("pgstore: leader lock: close its connection: %w", ctx.Err())
	}
}

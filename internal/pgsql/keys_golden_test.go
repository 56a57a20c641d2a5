package pgsql

import (
	"fmt"
	"strings"
	"time"
)

// dumpKeyedStatements adds the statements of idempotency keys to a golden
// dump: the keyed inserts, the keyed delayed insert and the forgetting of
// t, then, with strict (the single-node driver's), the strict inserts
// that it runs first in a transaction of their own (strictFirst); the
// single-node driver's keyed inserts register their partitions.
func dumpKeyedStatements(b *strings.Builder, t *Tables, strict bool) {
	register := noRegistration
	if strict {
		register = registerPerStatement
	}
	keyed := func(p InsertMessagesParams) Stmt { return t.insertKeyed(p, false, register) }
	q := func(name string, q Stmt) {
		fmt.Fprintf(b, "== %s\n%s\n-- args: %v\n\n", name, q.SQL, q.Args)
	}
	p := InsertMessagesParams{Topics: []string{"t", "u"}, UUIDs: []string{"u1", "u2"}, Payloads: [][]byte{[]byte("a"), nil},
		Metadata: []string{`{"a":"b"}`, ""}, Keys: []string{"11111111-2222-3333-4444-555555555555", ""}}
	q("InsertKeyed", keyed(p))
	p.NotifyChannel = "ch"
	p.PartitionHashes = []uint32{1, 4294967295}
	q("InsertKeyed notify hashes", keyed(p))
	p.DueAt = []time.Time{time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC), time.Date(2026, 1, 2, 3, 4, 6, 0, time.UTC)}
	q("InsertDelayedKeyed", t.insertDelayedKeyed(p, false))
	q("ForgetKeys", t.ForgetKeys())
	if strict {
		p.DueAt = nil
		q("InsertKeyed strict", t.insertKeyed(p, true, register))
		p.DueAt = []time.Time{time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC), time.Date(2026, 1, 2, 3, 4, 6, 0, time.UTC)}
		q("InsertDelayedKeyed strict", t.insertDelayedKeyed(p, true))
	}
}

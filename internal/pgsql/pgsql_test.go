package pgsql

import (
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5/pgtype"
)

func TestParseXID8Bytes(t *testing.T) {
	for _, s := range []string{"0", "1", "744", "4294967296", "18446744073709551615"} {
		want, _ := strconv.ParseUint(s, 10, 64)
		got, err := parseXID8Bytes([]byte(s))
		if err != nil || got != want {
			t.Errorf("parseXID8Bytes(%q) = %d, %v; want %d", s, got, err, want)
		}
	}
	for _, s := range []string{"", "-1", "1a", " 1", "18446744073709551616", "99999999999999999999", "123456789012345678901"} {
		if got, err := parseXID8Bytes([]byte(s)); err == nil {
			t.Errorf("parseXID8Bytes(%q) = %d, want an error", s, got)
		}
	}
}

// TestParseXID8BytesDoesNotAllocate: the fetch parses every message's
// transaction id with it (the consumer went from 23 to 10 allocations per
// message with it: benchmarks/measurements.md).
func TestParseXID8BytesDoesNotAllocate(t *testing.T) {
	b := []byte("18446744073709551615")
	if n := testing.AllocsPerRun(100, func() { _, _ = parseXID8Bytes(b) }); n != 0 {
		t.Errorf("parseXID8Bytes allocates %v times per call", n)
	}
}

func TestXID8ScansTextIntoTheUint64(t *testing.T) {
	var pos Position
	if err := (*xid8)(&pos.TransactionID).ScanText(pgtype.Text{String: "18446744073709551615", Valid: true}); err != nil {
		t.Fatal(err)
	}
	if pos.TransactionID != 1<<64-1 {
		t.Errorf("TransactionID = %d", pos.TransactionID)
	}
	for _, v := range []pgtype.Text{{}, {String: "-1", Valid: true}, {String: "", Valid: true}, {String: "1x", Valid: true}} {
		var x xid8
		if err := x.ScanText(v); err == nil {
			t.Errorf("ScanText(%+v) = %d, want an error", v, x)
		}
	}
}

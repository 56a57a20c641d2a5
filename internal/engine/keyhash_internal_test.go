package engine

import (
	"hash/fnv"
	"testing"
)

// TestKeyHashIsFNV1a: KeyHash, written out without allocating, is the
// 32-bit FNV-1a hash of hash/fnv that placed the keys of every earlier
// release, and allocates nothing.
func TestKeyHashIsFNV1a(t *testing.T) {
	for _, key := range []string{"", "a", "k3", "partition_key", "0190c7c4-7f3a-7c2e-9c1e-2b7d3c9f1a55", "ünïcødé", string([]byte{0xff, 0x00, 0x80})} {
		h := fnv.New32a()
		_, _ = h.Write([]byte(key))
		if got, want := KeyHash(key), h.Sum32(); got != want {
			t.Errorf("KeyHash(%q) = %d, hash/fnv New32a gives %d", key, got, want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { _ = KeyHash("0190c7c4-7f3a-7c2e-9c1e-2b7d3c9f1a55") }); n != 0 {
		t.Errorf("KeyHash allocates %v times", n)
	}
}

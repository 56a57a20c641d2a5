package main

import (
	"fmt"
	"testing"

	pglease "github.com/pglease/watermill-pglease"
)

// The partitions workload's keys load every partition alike, as its
// description in results.md says.
func TestPartitionKeysSpreadEvenly(t *testing.T) {
	for _, n := range partitionCounts {
		perPartition := make([]int, n)
		for i := range partitionKeys {
			perPartition[pglease.PartitionOf(fmt.Sprintf(partitionKeyFormat, i), n)]++
		}
		for p, got := range perPartition {
			if got != partitionKeys/n {
				t.Errorf("%d partitions: partition %d has %d keys, want %d (all: %v)", n, p, got, partitionKeys/n, perPartition)
			}
		}
	}
}

func TestKeyOrder(t *testing.T) {
	k0, k1 := fmt.Sprintf(partitionKeyFormat, 0), fmt.Sprintf(partitionKeyFormat, 1)
	p0, p1 := pglease.PartitionOf(k0, 8), pglease.PartitionOf(k1, 8)
	k := newKeyOrder(8)
	for _, r := range []string{
		fmt.Sprintf("%s 0 %d", k0, p0),
		fmt.Sprintf("%s 0 %d", k1, p1),
		fmt.Sprintf("%s 1 %d", k0, p0),
		fmt.Sprintf("%s 1 %d", k0, p0), // reported twice
		fmt.Sprintf("%s 3 %d", k0, p0),
		fmt.Sprintf("%s 2 %d", k0, p0), // out of order
	} {
		if err := k.add(r); err != nil {
			t.Fatal(err)
		}
	}
	if k.distinct != 5 || k.duplicates != 1 || k.violations != 1 {
		t.Fatalf("distinct %d, duplicates %d, violations %d; want 5, 1, 1", k.distinct, k.duplicates, k.violations)
	}
	if want := fmt.Sprintf("key %s: message 2 after 3", k0); k.first != want {
		t.Errorf("first violation %q, want %q", k.first, want)
	}
	if err := k.add(fmt.Sprintf("%s 4 %d", k0, (p0+1)%8)); err == nil {
		t.Error("a message from another partition than its key's was accepted")
	}
}

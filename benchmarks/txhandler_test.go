package main

import (
	"testing"
)

// Over as many runs as there are variants, each variant runs first, in
// each other place, and once per run.
func TestTxOrderRotates(t *testing.T) {
	n := len(txVariants)
	places := make(map[string]map[int]bool)
	for run := 1; run <= n; run++ {
		order := txOrder(run)
		if len(order) != n {
			t.Fatalf("run %d: %d variants, want %d", run, len(order), n)
		}
		seen := map[string]bool{}
		for i, v := range order {
			if seen[v.name] {
				t.Fatalf("run %d: %s twice in %v", run, v.name, order)
			}
			seen[v.name] = true
			if places[v.name] == nil {
				places[v.name] = map[int]bool{}
			}
			places[v.name][i] = true
		}
	}
	for _, v := range txVariants {
		if len(places[v.name]) != n {
			t.Errorf("%s ran in places %v over %d runs, want each of 0..%d", v.name, places[v.name], n, n-1)
		}
	}
	if txOrder(1)[0].name != txPlain {
		t.Errorf("the first run starts with %s, want %s", txOrder(1)[0].name, txPlain)
	}
}

// The groups of the variants are distinct and none is the group of the
// other workloads, so that each starts at the beginning of the topic.
func TestTxVariantGroupsAreFresh(t *testing.T) {
	seen := map[string]bool{consumerGroup: true}
	for _, v := range txVariants {
		if seen[v.group()] {
			t.Errorf("group %q used twice", v.group())
		}
		seen[v.group()] = true
	}
}

func TestQuickShrinksTxMessages(t *testing.T) {
	cfg, err := parseFlags([]string{"-dsn", "x", "-quick"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.txMessages != 2_000 {
		t.Errorf("quick: tx-messages %d, want 2,000", cfg.txMessages)
	}
	cfg, err = parseFlags([]string{"-dsn", "x", "-quick", "-tx-messages", "500", "-only", "tx-handler"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.txMessages != 500 {
		t.Errorf("quick with -tx-messages 500: %d", cfg.txMessages)
	}
	if _, err := parseFlags([]string{"-dsn", "x", "-tx-messages", "0"}); err == nil {
		t.Error("-tx-messages 0 was accepted")
	}
}

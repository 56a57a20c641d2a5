package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/watermill-pglease/admin"
)

// TestPrintHorizon: what status says about the horizon's holder, whether
// there is none, it is young, old, a prepared transaction, or hidden from
// the role.
func TestPrintHorizon(t *testing.T) {
	start := time.Date(2026, 11, 23, 8, 0, 0, 0, time.UTC)
	backend := func(age time.Duration) *admin.HorizonHolder {
		return &admin.HorizonHolder{PID: 4242, ApplicationName: "report", State: "idle in transaction",
			XactStart: start, QueryStart: start.Add(time.Second), Age: age, Query: "UPDATE  t\n SET x = 1"}
	}
	for _, tc := range []struct {
		name   string
		holder *admin.HorizonHolder
		held   *bool
		want   []string
	}{
		{"none", nil, ptr(false), []string{"xmin     812\n", "held by  nothing: no writing transaction is running, no topic is held back\n"}},
		{"young", backend(300 * time.Millisecond), ptr(false), []string{
			"held by      pid 4242\n", "application  report\n", "state        idle in transaction\n",
			"age          300ms (since 2026-11-23T08:00:00Z)\n", "query        UPDATE t SET x = 1\n",
			"Delivery is not held back: the oldest writing transaction is 300ms old (less than --warn-after 5s).",
		}},
		{"old", backend(90 * time.Second), ptr(true), []string{
			"age          1m30s (since 2026-11-23T08:00:00Z)\n",
			"query start  2026-11-23T08:00:01Z (1m29s ago)\n",
			"DELIVERY IS HELD BACK: pid 4242 has kept a writing transaction open for 1m30s.",
			"SELECT pg_terminate_backend(4242).",
		}},
		{"prepared", &admin.HorizonHolder{GID: "tx'1", State: "prepared", XactStart: start, Age: time.Minute}, ptr(true), []string{
			"held by  prepared transaction \"tx'1\"\n", "state    prepared\n",
			"DELIVERY IS HELD BACK: prepared transaction \"tx'1\" has kept a writing transaction open for 1m0s.",
			"COMMIT PREPARED or ROLLBACK PREPARED 'tx''1'.",
		}},
		{"hidden", &admin.HorizonHolder{PID: 4242, ApplicationName: "psql", Query: "<insufficient privilege>"}, nil, []string{
			"state        -\n", "age          unknown: hidden from this role (grant it pg_read_all_stats)\n",
			"query        <insufficient privilege>\n",
			"Delivery may be held back: pid 4242 runs a writing transaction, for how long this role cannot see.",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := newStatusOutput(nil, admin.Horizon{Xmin: 812, Holder: tc.holder}, 5*time.Second)
			assert.Equal(t, tc.held, out.DeliveryHeldBack)
			assert.NotNil(t, out.Sessions, "[] in JSON, not null")
			var b bytes.Buffer
			printHorizon(&b, out, 5*time.Second)
			for _, w := range tc.want {
				assert.Contains(t, b.String(), w)
			}
			if tc.name == "hidden" {
				assert.NotContains(t, b.String(), "query start")
			}
		})
	}
}

// TestStatusCitusWorkerWithoutHolder: on Citus, the worker with the
// lowest horizon and no transaction holding it is not said to hold its
// topics back.
func TestStatusCitusWorkerWithoutHolder(t *testing.T) {
	h := admin.Horizon{Xmin: 812, Node: "10.0.0.11:5432", Workers: make([]admin.Horizon, 2)}
	out := newStatusOutput(nil, h, 5*time.Second)
	var b bytes.Buffer
	printHorizon(&b, out, 5*time.Second)
	assert.Contains(t, b.String(), "worker   10.0.0.11:5432 (of 2; the lowest horizon)\n")
	assert.Contains(t, b.String(), "held by  nothing: no writing transaction is running, no topic is held back\n")
	assert.NotContains(t, b.String(), "held back)")
}

func ptr[T any](v T) *T { return &v }

// TestREADMEStatusSample: the README's sample of pglease status has the
// sections that status prints, in its order.
func TestREADMEStatusSample(t *testing.T) {
	f := newFixture(t)
	f.publish("t", 1)
	f.subscribe("g", "t")
	var out string
	waitFor(t, 10*time.Second, "a maintainer to be elected", func() bool {
		out = f.ok("status")
		return strings.Contains(out, "Maintainer: session")
	})
	sections := func(text string) []string {
		var found []string
		for _, line := range strings.Split(text, "\n") {
			line = strings.TrimSpace(line)
			for _, s := range []string{"Sessions:", "GROUP ", "Maintainer:", "Xmin horizon:"} {
				if strings.HasPrefix(line, s) {
					found = append(found, s)
				}
			}
		}
		return found
	}
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	_, sample, ok := strings.Cut(string(readme), "$ pglease status\n")
	require.True(t, ok, "the README has a sample of pglease status")
	sample, _, _ = strings.Cut(sample, "$ pglease ")
	assert.Equal(t, sections(out), sections(sample), "status printed:\n%s", out)
}

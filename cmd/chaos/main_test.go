package main

import (
	"io"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/chaos"
)

func TestParseKillsDefault(t *testing.T) {
	cases := []struct {
		args  []string
		kills int
	}{
		{nil, 3},
		{[]string{"-orders", "50000"}, 25},
		{[]string{"-orders", "50000", "-kills", "0"}, 0},
		{[]string{"-orders", "100", "-kills", "7"}, 7},
	}
	for _, c := range cases {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			opt, err := parse(c.args, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if opt.cfg.Kills != c.kills {
				t.Errorf("kills = %d, want %d", opt.cfg.Kills, c.kills)
			}
		})
	}
}

func TestParseRejects(t *testing.T) {
	for _, args := range [][]string{{"-fault-scale", "-1"}, {"-orders", "many"}, {"-nope"}} {
		if _, err := parse(args, io.Discard); err == nil {
			t.Errorf("parse(%q) accepted", args)
		}
	}
}

func TestScaled(t *testing.T) {
	d := chaos.DefaultFaults()
	if got := scaled(d, 1); got != d {
		t.Errorf("scale 1 = %+v, want the defaults %+v", got, d)
	}
	if got := scaled(d, 0); got.DropAfterProcessing != 0 || got.Status5xx != 0 {
		t.Errorf("scale 0 = %+v, want no faults", got)
	}
	if got := scaled(d, 100); got.Status5xx != 1 {
		t.Errorf("scale 100: Status5xx = %v, want capped at 1", got.Status5xx)
	}
}

func TestRunReportsBadFlags(t *testing.T) {
	var errOut strings.Builder
	if code := run(t.Context(), []string{"-provider"}, io.Discard, &errOut); code != 2 {
		t.Errorf("exit %d, want 2; stderr %s", code, errOut.String())
	}
}

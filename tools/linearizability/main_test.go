package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

func str(s string) *string { return &s }

func put(client int, key, value string, call, ret int64) Operation {
	return Operation{Client: client, Kind: "put", Key: key, Value: str(value), Call: call, Return: ret, Status: "ok"}
}

func get(client int, key string, value *string, call, ret int64) Operation {
	out := Output{}
	if value != nil {
		out = Output{Found: true, Value: *value}
	}
	return Operation{Client: client, Kind: "get", Key: key, Call: call, Return: ret, Status: "ok", Output: out}
}

func check(t *testing.T, operations []Operation) Verdict {
	t.Helper()
	prepared, err := Prepare(operations)
	if err != nil {
		t.Fatalf("prepare: %v", err)
	}
	return Check(prepared, 10*time.Second)
}

func TestLinearizableHistory(t *testing.T) {
	history := []Operation{
		put(0, "a", "1", 0, 10),
		// Overlaps the put: may see either value.
		get(1, "a", nil, 5, 8),
		get(1, "a", str("1"), 11, 12),
		{Client: 2, Kind: "cas", Key: "a", Expected: str("1"), New: str("2"), Call: 13, Return: 20, Status: "ok",
			Output: Output{Swapped: true, Found: true, Value: "2"}},
		{Client: 0, Kind: "cas", Key: "a", Expected: str("1"), New: str("3"), Call: 21, Return: 22, Status: "ok",
			Output: Output{Swapped: false, Found: true, Value: "2"}},
		// A put that timed out: it may take effect any time after its call, here before the read.
		{Client: 1, Kind: "put", Key: "b", Value: str("x"), Call: 23, Return: 24, Status: "unknown"},
		get(2, "b", str("x"), 30, 31),
		// A write that failed is left out: the read still sees "x".
		{Client: 0, Kind: "put", Key: "b", Value: str("lost"), Call: 32, Return: 33, Status: "fail"},
		get(2, "b", str("x"), 34, 35),
		{Client: 0, Kind: "delete", Key: "a", Call: 36, Return: 37, Status: "ok"},
		get(1, "a", nil, 38, 39),
	}
	verdict := check(t, history)
	if verdict.Result != porcupine.Ok {
		t.Fatalf("expected linearizable, got %v (bad keys %v)", verdict.Result, verdict.BadKeys)
	}
}

func TestStaleReadIsNotLinearizable(t *testing.T) {
	history := []Operation{
		put(0, "a", "1", 0, 10),
		put(0, "a", "2", 11, 20),
		// Starts after "2" was acknowledged, yet reads "1": a stale read.
		get(1, "a", str("1"), 21, 22),
		put(0, "ok", "v", 0, 1),
		get(1, "ok", str("v"), 2, 3),
	}
	verdict := check(t, history)
	if verdict.Result != porcupine.Illegal {
		t.Fatalf("expected not linearizable, got %v", verdict.Result)
	}
	if len(verdict.BadKeys) != 1 || verdict.BadKeys[0] != "a" {
		t.Fatalf("expected only key a at fault, got %v", verdict.BadKeys)
	}
}

func TestCasMustSeeTheValueItReplaces(t *testing.T) {
	history := []Operation{
		put(0, "a", "1", 0, 1),
		// Claims to have swapped although the key held "1", not "0".
		{Client: 1, Kind: "cas", Key: "a", Expected: str("0"), New: str("2"), Call: 2, Return: 3, Status: "ok",
			Output: Output{Swapped: true, Found: true, Value: "2"}},
	}
	if verdict := check(t, history); verdict.Result != porcupine.Illegal {
		t.Fatalf("expected not linearizable, got %v", verdict.Result)
	}
}

func TestUnknownWriteCannotTakeEffectBeforeItsCall(t *testing.T) {
	history := []Operation{
		get(0, "a", str("x"), 0, 1),
		{Client: 1, Kind: "put", Key: "a", Value: str("x"), Call: 2, Return: 3, Status: "unknown"},
	}
	if verdict := check(t, history); verdict.Result != porcupine.Illegal {
		t.Fatalf("expected not linearizable, got %v", verdict.Result)
	}
}

func TestCommandLineExitCodesAndVisualization(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, operations []Operation) string {
		bytes, err := json.Marshal(History{Operations: operations})
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, bytes, 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	good := write("good.json", []Operation{put(0, "a", "1", 0, 1), get(1, "a", str("1"), 2, 3)})
	bad := write("bad.json", []Operation{put(0, "a", "1", 0, 1), get(1, "a", nil, 2, 3)})
	html := filepath.Join(dir, "bad.html")

	var stdout, stderr bytes.Buffer
	if code := run([]string{good}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d for a linearizable history: %s %s", code, stdout.String(), stderr.String())
	}
	if got := stdout.String(); got != "linearizable: 2 ops, 1 keys\n" {
		t.Fatalf("unexpected summary %q", got)
	}
	stdout.Reset()
	if code := run([]string{"-html", html, bad}, &stdout, &stderr); code != 1 {
		t.Fatalf("exit %d for a non-linearizable history", code)
	}
	if got := stdout.String(); !strings.HasPrefix(got, `NOT linearizable: key "a"`) {
		t.Fatalf("unexpected verdict %q", got)
	}
	if info, err := os.Stat(html); err != nil || info.Size() == 0 {
		t.Fatalf("no visualization written: %v", err)
	}
	if code := run([]string{filepath.Join(dir, "missing.json")}, &stdout, &stderr); code != 3 {
		t.Fatalf("exit %d for a missing file", code)
	}
}

func TestTimeoutIsReportedAsSuch(t *testing.T) {
	// 24 overlapping writes, then a read of a value none of them wrote: deciding that takes
	// trying every order of the writes, far more than the nanosecond allowed.
	var history []Operation
	for i := 0; i < 24; i++ {
		history = append(history, put(i, "a", string(rune('a'+i)), 0, 100))
	}
	history = append(history, get(24, "a", str("never written"), 200, 201))
	bytes, err := json.Marshal(History{Operations: history})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "slow.json")
	if err := os.WriteFile(path, bytes, 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr strings.Builder
	if code := run([]string{"-timeout", "1ns", path}, &stdout, &stderr); code != 2 {
		t.Fatalf("exit %d with a 1ns timeout: %s", code, stdout.String())
	}
	if !strings.HasPrefix(stdout.String(), "timed out after 1ns: 25 ops, 1 keys") {
		t.Fatalf("unexpected summary %q", stdout.String())
	}
}

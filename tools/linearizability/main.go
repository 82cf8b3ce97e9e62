// Command linearizability checks a history of onekv client operations for linearizability with
// porcupine (github.com/anishathalye/porcupine), one register per key.
//
// It owns reading the history file, the per-key register model, and reporting the verdict. It does
// not own recording histories (the nemesis tests in crates/onekv/tests do that) or injecting faults.
//
// # Usage
//
//	go run . [-html out.html] [-timeout 60s] history.json
//
// Prints one line and exits with:
//
//	0  "linearizable: N ops, K keys"
//	1  "NOT linearizable: key "k1", key "k7" (of N ops, K keys)"  (and writes -html if given)
//	2  "timed out after D: N ops, K keys" (porcupine could not decide in time)
//	3  the history could not be read
//
// # History format
//
// A JSON object with an "operations" array (other top-level fields, such as a seed, are ignored).
// Each operation:
//
//	{
//	  "client":   3,              // the recording client task; its operations never overlap
//	  "kind":     "get" | "put" | "delete" | "cas",
//	  "key":      "k1",
//	  "value":    "v-17",         // put: the value written
//	  "expected": "v-3" | null,   // cas: the value the key must hold (null: the key must be absent)
//	  "new":      "v-18" | null,  // cas: the value to write (null: delete the key)
//	  "call":     1700000000,     // invocation time, ns, from one clock shared by every client
//	  "return":   1700000500,     // response time, ns (ignored unless status is "ok")
//	  "status":   "ok" | "fail" | "unknown",
//	  "output":   {"found": true, "value": "v-17", "swapped": false}
//	}
//
// "output" is read only for status "ok": for get, whether the key was found and its value; for cas,
// whether it swapped, and the key's value after the operation (found/value: the new value if it
// swapped, the unchanged current one if not).
//
// Status "fail" means the operation definitely did not take effect: it is left out. Status
// "unknown" means it may or may not have taken effect (a timed-out or unanswered write): as in
// porcupine's own examples, such an operation returns at the end of the history and any output
// is accepted, so the checker may place it anywhere after its call, including after every other
// operation (which is the same as it never happening). A get whose status is not "ok" tells
// nothing and is left out.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// Operation is one recorded client operation, as in the history file.
type Operation struct {
	Client   int     `json:"client"`
	Kind     string  `json:"kind"`
	Key      string  `json:"key"`
	Value    *string `json:"value"`
	Expected *string `json:"expected"`
	New      *string `json:"new"`
	Call     int64   `json:"call"`
	Return   int64   `json:"return"`
	Status   string  `json:"status"`
	Output   Output  `json:"output"`
}

// Output is what an operation that completed returned.
type Output struct {
	Found   bool   `json:"found"`
	Value   string `json:"value"`
	Swapped bool   `json:"swapped"`
}

// History is the whole history file.
type History struct {
	Operations []Operation `json:"operations"`
}

// input is what porcupine sees at a call event.
type input struct {
	kind     string
	key      string
	value    *string // put's value; cas's new value
	expected *string // cas only
}

// output is what porcupine sees at a return event.
type output struct {
	unknown bool // the operation may or may not have happened: accept anything
	found   bool
	value   string
	swapped bool
}

// register is one key's state: absent, or present with a value.
type register struct {
	present bool
	value   string
}

func (r register) String() string {
	if !r.present {
		return "absent"
	}
	return fmt.Sprintf("%q", r.value)
}

func holds(state register, want *string) bool {
	if want == nil {
		return !state.present
	}
	return state.present && state.value == *want
}

func set(value *string) register {
	if value == nil {
		return register{}
	}
	return register{present: true, value: *value}
}

// step is the register's sequential specification.
func step(stateAny, inAny, outAny interface{}) (bool, interface{}) {
	state := stateAny.(register)
	in := inAny.(input)
	out := outAny.(output)
	switch in.kind {
	case "get":
		if out.unknown {
			return true, state
		}
		return holds(state, optional(out.found, out.value)), state
	case "put":
		return true, set(in.value)
	case "delete":
		return true, register{}
	case "cas":
		matches := holds(state, in.expected)
		if out.unknown {
			if matches {
				return true, set(in.value)
			}
			return true, state
		}
		if out.swapped {
			return matches && holds(set(in.value), optional(out.found, out.value)), set(in.value)
		}
		return !matches && holds(state, optional(out.found, out.value)), state
	}
	return false, state
}

func optional(found bool, value string) *string {
	if !found {
		return nil
	}
	return &value
}

func describe(value *string) string {
	if value == nil {
		return "absent"
	}
	return fmt.Sprintf("%q", *value)
}

func describeOperation(inAny, outAny interface{}) string {
	in := inAny.(input)
	out := outAny.(output)
	result := ""
	switch {
	case out.unknown:
		result = " -> ?"
	case in.kind == "get":
		result = " -> " + describe(optional(out.found, out.value))
	case in.kind == "cas":
		result = fmt.Sprintf(" -> swapped=%v, now %s", out.swapped, describe(optional(out.found, out.value)))
	}
	switch in.kind {
	case "put":
		return fmt.Sprintf("put(%q, %s)%s", in.key, describe(in.value), result)
	case "cas":
		return fmt.Sprintf("cas(%q, %s -> %s)%s", in.key, describe(in.expected), describe(in.value), result)
	default:
		return fmt.Sprintf("%s(%q)%s", in.kind, in.key, result)
	}
}

// model is a register per key: porcupine checks each key's operations on their own.
func model() porcupine.Model {
	return porcupine.Model{
		PartitionEvent: func(history []porcupine.Event) [][]porcupine.Event {
			keys := map[int]string{}
			byKey := map[string][]porcupine.Event{}
			var order []string
			for _, event := range history {
				if event.Kind == porcupine.CallEvent {
					keys[event.Id] = event.Value.(input).key
				}
				key := keys[event.Id]
				if _, seen := byKey[key]; !seen {
					order = append(order, key)
				}
				byKey[key] = append(byKey[key], event)
			}
			partitions := make([][]porcupine.Event, 0, len(order))
			for _, key := range order {
				partitions = append(partitions, byKey[key])
			}
			return partitions
		},
		Init:              func() interface{} { return register{} },
		Step:              step,
		DescribeOperation: describeOperation,
		DescribeState:     func(state interface{}) string { return state.(register).String() },
	}
}

// Prepared is a history turned into porcupine events.
type Prepared struct {
	Events []porcupine.Event
	// Ops counts the operations checked (ok and unknown writes).
	Ops int
	// Keys lists the keys they touch, sorted.
	Keys []string
}

// Prepare validates the operations and turns them into a time-ordered event list: a call event at
// each call, a return event at each "ok" return, and the return events of "unknown" operations
// after every other event. Operations that failed, and reads that did not complete, are dropped.
func Prepare(operations []Operation) (Prepared, error) {
	type timed struct {
		time  int64
		order int // breaks ties: calls before returns (the more permissive order), then input order
		event porcupine.Event
	}
	var timeline []timed
	var unknownReturns []porcupine.Event
	keys := map[string]bool{}
	ops := 0
	// The visualization wants one lane per client with no overlapping operations; an unknown
	// operation stays open to the end, so the client's later operations go to a fresh lane.
	lanes := map[[2]int]int{}
	generation := map[int]int{}
	lane := func(client int) int {
		id := [2]int{client, generation[client]}
		if _, ok := lanes[id]; !ok {
			lanes[id] = len(lanes)
		}
		return lanes[id]
	}
	for i, op := range operations {
		where := fmt.Sprintf("operation %d (%s %q)", i, op.Kind, op.Key)
		in := input{kind: op.Kind, key: op.Key}
		switch op.Kind {
		case "get", "delete":
		case "put":
			if op.Value == nil {
				return Prepared{}, fmt.Errorf("%s: a put needs a value", where)
			}
			in.value = op.Value
		case "cas":
			in.expected, in.value = op.Expected, op.New
		default:
			return Prepared{}, fmt.Errorf("%s: unknown kind (expected get, put, delete or cas)", where)
		}
		switch op.Status {
		case "ok":
			if op.Return < op.Call {
				return Prepared{}, fmt.Errorf("%s: returns at %d, before its call at %d", where, op.Return, op.Call)
			}
		case "unknown":
			if op.Kind == "get" {
				continue
			}
		case "fail":
			continue
		default:
			return Prepared{}, fmt.Errorf("%s: unknown status %q (expected ok, fail or unknown)", where, op.Status)
		}
		ops++
		keys[op.Key] = true
		client := lane(op.Client)
		timeline = append(timeline, timed{op.Call, 2 * i, porcupine.Event{
			ClientId: client, Kind: porcupine.CallEvent, Value: in, Id: i,
		}})
		if op.Status == "unknown" {
			generation[op.Client]++
			unknownReturns = append(unknownReturns, porcupine.Event{
				ClientId: client, Kind: porcupine.ReturnEvent, Value: output{unknown: true}, Id: i,
			})
			continue
		}
		out := output{found: op.Output.Found, value: op.Output.Value, swapped: op.Output.Swapped}
		timeline = append(timeline, timed{op.Return, 2*len(operations) + i, porcupine.Event{
			ClientId: client, Kind: porcupine.ReturnEvent, Value: out, Id: i,
		}})
	}
	sort.SliceStable(timeline, func(a, b int) bool {
		if timeline[a].time != timeline[b].time {
			return timeline[a].time < timeline[b].time
		}
		return timeline[a].order < timeline[b].order
	})
	events := make([]porcupine.Event, 0, len(timeline)+len(unknownReturns))
	for _, t := range timeline {
		events = append(events, t.event)
	}
	events = append(events, unknownReturns...)
	sorted := make([]string, 0, len(keys))
	for key := range keys {
		sorted = append(sorted, key)
	}
	sort.Strings(sorted)
	return Prepared{Events: events, Ops: ops, Keys: sorted}, nil
}

// Verdict is the outcome of a check.
type Verdict struct {
	Result porcupine.CheckResult
	// BadKeys lists the keys whose operations are not linearizable (when Result is Illegal).
	BadKeys []string
	Info    porcupine.LinearizationInfo
}

// Check runs porcupine on a prepared history within timeout (0: no limit). When the history is
// not linearizable it checks each key alone to name the ones at fault.
func Check(prepared Prepared, timeout time.Duration) Verdict {
	started := time.Now()
	result, info := porcupine.CheckEventsVerbose(model(), prepared.Events, timeout)
	verdict := Verdict{Result: result, Info: info}
	if result != porcupine.Illegal {
		return verdict
	}
	byKey := model().PartitionEvent(prepared.Events)
	single := model()
	single.PartitionEvent = nil
	for _, events := range byKey {
		remaining := time.Duration(0)
		if timeout > 0 {
			remaining = timeout - time.Since(started)
			if remaining <= 0 {
				break
			}
		}
		if porcupine.CheckEventsTimeout(single, events, remaining) == porcupine.Illegal {
			verdict.BadKeys = append(verdict.BadKeys, events[0].Value.(input).key)
		}
	}
	sort.Strings(verdict.BadKeys)
	return verdict
}

// run is the command without the process around it; it returns the exit code.
func run(args []string, stdout, stderr io.Writer) int {
	flags := flag.NewFlagSet("linearizability", flag.ContinueOnError)
	flags.SetOutput(stderr)
	htmlPath := flags.String("html", "", "write porcupine's visualization here when the history is not linearizable")
	timeout := flags.Duration("timeout", 60*time.Second, "give up (exit 2) after this long; 0: no limit")
	flags.Usage = func() {
		fmt.Fprintln(stderr, "usage: linearizability [-html out.html] [-timeout 60s] history.json")
		flags.PrintDefaults()
	}
	if err := flags.Parse(args); err != nil {
		return 3
	}
	if flags.NArg() != 1 {
		flags.Usage()
		return 3
	}
	prepared, err := load(flags.Arg(0))
	if err != nil {
		fmt.Fprintf(stderr, "cannot read the history: %v\n", err)
		return 3
	}
	verdict := Check(prepared, *timeout)
	size := fmt.Sprintf("%d ops, %d keys", prepared.Ops, len(prepared.Keys))
	switch verdict.Result {
	case porcupine.Ok:
		fmt.Fprintf(stdout, "linearizable: %s\n", size)
		return 0
	case porcupine.Illegal:
		quoted := make([]string, len(verdict.BadKeys))
		for i, key := range verdict.BadKeys {
			quoted[i] = fmt.Sprintf("key %q", key)
		}
		if len(quoted) == 0 {
			quoted = []string{"key unknown (timed out naming it)"}
		}
		fmt.Fprintf(stdout, "NOT linearizable: %s (of %s)\n", strings.Join(quoted, ", "), size)
		if *htmlPath != "" {
			if err := porcupine.VisualizePath(model(), verdict.Info, *htmlPath); err != nil {
				fmt.Fprintf(stderr, "cannot write the visualization: %v\n", err)
			} else {
				fmt.Fprintf(stderr, "visualization written to %s\n", *htmlPath)
			}
		}
		return 1
	default:
		fmt.Fprintf(stdout, "timed out after %v: %s\n", *timeout, size)
		return 2
	}
}

func load(path string) (Prepared, error) {
	bytes, err := os.ReadFile(path)
	if err != nil {
		return Prepared{}, err
	}
	var history History
	if err := json.Unmarshal(bytes, &history); err != nil {
		return Prepared{}, err
	}
	if history.Operations == nil {
		return Prepared{}, errors.New(`no "operations" array`)
	}
	return Prepare(history.Operations)
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

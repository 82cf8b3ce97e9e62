// go-redis v9 against a onekv cluster, with the library's default options (HELLO 3 on connect).
//
//	go run . ADDR_A [ADDR_B]
//
// ADDR_A and ADDR_B are the RESP addresses (host:port) of two different nodes. Checks PING,
// SET/GET, INCR, a TxPipelined (MULTI/EXEC) transaction, an error inside EXEC, WATCH aborting
// EXEC after another client's write, hashes (HSET, HGETALL, HMGET, HINCRBY, HDEL, WRONGTYPE), and
// two clients on two nodes incrementing one counter 200 times each with client.Watch
// (WATCH/GET/MULTI/SET/EXEC), which must end at exactly 400; a script (redis.NewScript) run 50
// times from each node, every run counted once; a BLPOP woken by an RPUSH through the other node.
// Prints one line of what it checked; exits 1 with a message on any mismatch.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

const increments = 200

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "go-redis: FAIL: "+format+"\n", args...)
	os.Exit(1)
}

// expect(what, want)(cmd.Result()) fails unless the command succeeded with reply want.
func expect[T comparable](what string, want T) func(T, error) {
	return func(got T, err error) {
		if err != nil {
			fail("%s: %v", what, err)
		}
		if got != want {
			fail("%s: got %v, want %v", what, got, want)
		}
	}
}

// incrementWatched adds 1 to key with an optimistic WATCH transaction, retrying on conflict.
func incrementWatched(ctx context.Context, c *redis.Client, key string) (retries int, err error) {
	txf := func(tx *redis.Tx) error {
		n, err := tx.Get(ctx, key).Int()
		if err != nil && err != redis.Nil {
			return err
		}
		_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Set(ctx, key, n+1, 0)
			return nil
		})
		return err
	}
	for ; retries < 10000; retries++ {
		err = c.Watch(ctx, txf, key)
		if !errors.Is(err, redis.TxFailedErr) {
			return retries, err
		}
	}
	return retries, fmt.Errorf("gave up after %d conflicts", retries)
}

func main() {
	if len(os.Args) < 2 || len(os.Args) > 3 {
		fail("usage: go run . ADDR_A [ADDR_B]")
	}
	addrB := os.Args[len(os.Args)-1]
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	a := redis.NewClient(&redis.Options{Addr: os.Args[1]})
	b := redis.NewClient(&redis.Options{Addr: addrB})
	defer a.Close()
	defer b.Close()
	// Fresh keys on every run, all in one shard: onekv refuses (CROSSSLOT) a transaction whose keys
	// span shards, so they share a {hash tag}.
	p := fmt.Sprintf("{goredis:%d}:", time.Now().UnixNano())

	expect("PING", "PONG")(a.Ping(ctx).Result())
	expect("SET", "OK")(a.Set(ctx, p+"k", "v", 0).Result())
	expect("GET", "v")(a.Get(ctx, p+"k").Result())
	expect("GET through node B", "v")(b.Get(ctx, p+"k").Result())
	expect("INCR", int64(1))(a.Incr(ctx, p+"n").Result())

	// TxPipelined: MULTI, INCR, INCR, SET, GET, EXEC.
	var incr *redis.IntCmd
	var get *redis.StringCmd
	cmds, err := a.TxPipelined(ctx, func(t redis.Pipeliner) error {
		t.Incr(ctx, p+"n")
		incr = t.Incr(ctx, p+"n")
		t.Set(ctx, p+"a", "1", 0)
		get = t.Get(ctx, p+"n")
		return nil
	})
	if err != nil || len(cmds) != 4 {
		fail("TxPipelined: err %v, replies %v", err, cmds)
	}
	expect("INCR in TxPipelined", int64(3))(incr.Result())
	expect("GET in TxPipelined", "3")(get.Result())
	expect("GET after EXEC", "1")(a.Get(ctx, p+"a").Result())

	// A command failing at run time inside EXEC is its own error; the others still apply.
	a.Set(ctx, p+"s", "text", 0)
	cmds, err = a.TxPipelined(ctx, func(t redis.Pipeliner) error {
		t.Set(ctx, p+"b", "x", 0)
		t.Incr(ctx, p+"s")
		t.Set(ctx, p+"c", "y", 0)
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "not an integer") || len(cmds) != 3 ||
		cmds[0].Err() != nil || cmds[2].Err() != nil {
		fail("EXEC with a failing INCR: err %v, replies %v", err, cmds)
	}
	expect("GET after EXEC with an error", "y")(a.Get(ctx, p+"c").Result())

	// WATCH aborts EXEC when another client (on the other node) writes the key first.
	a.Set(ctx, p+"w", "0", 0)
	err = a.Watch(ctx, func(tx *redis.Tx) error {
		expect("GET under WATCH", "0")(tx.Get(ctx, p+"w").Result())
		b.Set(ctx, p+"w", "changed", 0)
		_, err := tx.TxPipelined(ctx, func(t redis.Pipeliner) error {
			t.Set(ctx, p+"w", "mine", 0)
			return nil
		})
		return err
	}, p+"w")
	if !errors.Is(err, redis.TxFailedErr) {
		fail("EXEC after a watched key changed: got %v, want %v", err, redis.TxFailedErr)
	}
	expect("GET after aborted EXEC", "changed")(a.Get(ctx, p+"w").Result())

	// Hashes: HSET of a map, HGETALL (a RESP3 map with go-redis's defaults), HMGET, HINCRBY, HDEL,
	// and WRONGTYPE between a hash and a string.
	expect("HSET", int64(2))(a.HSet(ctx, p+"h", map[string]any{"name": "ada", "age": 36}).Result())
	all, err := b.HGetAll(ctx, p+"h").Result()
	if err != nil || len(all) != 2 || all["name"] != "ada" || all["age"] != "36" {
		fail("HGETALL through node B: %v, %v", all, err)
	}
	values, err := a.HMGet(ctx, p+"h", "name", "nope").Result()
	if err != nil || len(values) != 2 || values[0] != "ada" || values[1] != nil {
		fail("HMGET: %v, %v", values, err)
	}
	expect("HINCRBY", int64(37))(a.HIncrBy(ctx, p+"h", "age", 1).Result())
	if err := a.Get(ctx, p+"h").Err(); err == nil || !strings.HasPrefix(err.Error(), "WRONGTYPE") {
		fail("GET of a hash: %v, want WRONGTYPE", err)
	}
	expect("HDEL", int64(2))(a.HDel(ctx, p+"h", "name", "age").Result())
	expect("EXISTS after the last field's HDEL", int64(0))(a.Exists(ctx, p+"h").Result())

	// Two clients on two nodes, 200 optimistic increments each: exactly 400, none lost.
	var wg sync.WaitGroup
	retries := make([]int, 2)
	errs := make([]error, 2)
	for i, c := range []*redis.Client{a, b} {
		wg.Add(1)
		go func(i int, c *redis.Client) {
			defer wg.Done()
			for n := 0; n < increments && errs[i] == nil; n++ {
				r, err := incrementWatched(ctx, c, p+"counter")
				retries[i] += r
				errs[i] = err
			}
		}(i, c)
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			fail("WATCH increments by client %d: %v", i, err)
		}
	}
	expect("counter after both clients' WATCH increments", 2*increments)(a.Get(ctx, p+"counter").Int())

	// A script (EVALSHA, then EVAL after NOSCRIPT) run from both nodes at once: every run counted once.
	bump := redis.NewScript("local n = tonumber(redis.call('GET', KEYS[1]) or '0') + ARGV[1] " +
		"redis.call('SET', KEYS[1], n) return n")
	var seenMu sync.Mutex
	seen := map[int64]bool{}
	for _, c := range []*redis.Client{a, b} {
		wg.Add(1)
		go func(c *redis.Client) {
			defer wg.Done()
			for n := 0; n < 50; n++ {
				v, err := bump.Run(ctx, c, []string{p + "scripted"}, 1).Int64()
				if err != nil {
					fail("script run: %v", err)
				}
				seenMu.Lock()
				seen[v] = true
				seenMu.Unlock()
			}
		}(c)
	}
	wg.Wait()
	if len(seen) != 100 || !seen[1] || !seen[100] {
		fail("script runs saw %d distinct counts, want 1..100", len(seen))
	}

	// BLPOP through node A, woken by an RPUSH through node B.
	popped := make(chan []string, 1)
	go func() {
		v, err := a.BLPop(ctx, 10*time.Second, p+"queue").Result()
		if err != nil {
			fail("BLPOP: %v", err)
		}
		popped <- v
	}()
	time.Sleep(200 * time.Millisecond)
	expect("RPUSH", int64(1))(b.RPush(ctx, p+"queue", "job").Result())
	if v := <-popped; len(v) != 2 || v[0] != p+"queue" || v[1] != "job" {
		fail("BLPOP woken by a push through another node: %v", v)
	}

	a.Del(ctx, p+"k", p+"n", p+"a", p+"s", p+"b", p+"c", p+"w", p+"counter", p+"scripted")
	fmt.Printf("go-redis %s: PING, SET/GET, INCR, TxPipelined, error in EXEC, WATCH abort, hashes, scripts, BLPOP, "+
		"WATCH counter %d (conflicts retried: %d + %d) OK\n",
		redis.Version(), 2*increments, retries[0], retries[1])
}

#!/usr/bin/env python3
"""Times the Redis commands that page through every key (DBSIZE, KEYS, RANDOMKEY, INFO keyspace,
SCAN, FLUSHALL) against a running onekv RESP front end holding N keys, as docs/redis.md reports.

    python3 scripts/redis-keyspace-scale.py [--port 6379] [--keys 200000]

Loads N keys of 100 bytes (`user:00000000`, ... in MSETs of 100 keys, pipelined), times each command
once, then FLUSHALL (which deletes them) and checks DBSIZE is 0. Meanwhile a writer on another
connection SETs keys one at a time: its latencies for 2 s before FLUSHALL and during it are printed
(p50, p99, max), to show whether the flush holds up other writes. Needs redis-py
(scripts/install-redis).
Deletes every key of the target: do not point it at data you want to keep.
"""
import argparse
import threading
import time

import redis


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=6379)
    parser.add_argument("--keys", type=int, default=200_000)
    args = parser.parse_args()
    r = redis.Redis(port=args.port)
    started = time.time()
    pipe = r.pipeline(transaction=False)
    for first in range(0, args.keys, 100):
        pipe.mset({f"user:{i:08d}": b"x" * 100 for i in range(first, min(args.keys, first + 100))})
        if first // 100 % 50 == 49:
            pipe.execute()
    pipe.execute()
    print(f"loaded {args.keys} keys in {time.time() - started:.1f} s")
    for command in (["DBSIZE"], ["KEYS", "*"], ["KEYS", "user:0000*"], ["RANDOMKEY"], ["INFO", "keyspace"],
                    ["INFO", "keyspace"], ["SCAN", "0", "COUNT", "1000"]):
        started = time.time()
        reply = r.execute_command(*command)
        if isinstance(reply, tuple):  # SCAN: (cursor, keys)
            shown = f"{len(reply[1])} keys"
        elif isinstance(reply, list):
            shown = f"{len(reply)} keys"
        else:
            shown = reply
        print(f"{' '.join(command)}: {time.time() - started:.3f} s -> {shown}")
    # A writer's SET latencies (s), each with the time it started.
    samples = []
    stop = threading.Event()

    def writer():
        w = redis.Redis(port=args.port)
        n = 0
        while not stop.is_set():
            began = time.time()
            w.set(f"writer:{n}", b"w" * 100)
            samples.append((began, time.time() - began))
            n += 1

    thread = threading.Thread(target=writer)
    thread.start()
    time.sleep(2)
    started = time.time()
    r.flushall()
    ended = time.time()
    stop.set()
    thread.join()
    print(f"FLUSHALL: {ended - started:.1f} s; DBSIZE after: {r.dbsize()}")
    for phase, low, high in (("before", started - 2, started), ("during", started, ended)):
        latencies = sorted(latency for began, latency in samples if low <= began < high)
        if latencies:
            pick = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000
            print(f"writer {phase} FLUSHALL: {len(latencies)} SETs, p50 {pick(0.5):.1f} ms, "
                  f"p99 {pick(0.99):.1f} ms, max {latencies[-1] * 1000:.1f} ms")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Times the Redis commands that page through every key (DBSIZE, KEYS, RANDOMKEY, INFO keyspace,
SCAN, FLUSHALL) against a running onekv RESP front end holding N keys, as docs/redis.md reports.

    python3 scripts/redis-keyspace-scale.py [--port 6379] [--keys 200000]

Loads N keys of 100 bytes (`user:00000000`, ... in MSETs of 100 keys, pipelined), times each command
once, then FLUSHALL (which deletes them) and checks DBSIZE is 0. Needs redis-py (scripts/install-redis).
Deletes every key of the target: do not point it at data you want to keep.
"""
import argparse
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
    started = time.time()
    r.flushall()
    print(f"FLUSHALL: {time.time() - started:.1f} s; DBSIZE after: {r.dbsize()}")


if __name__ == "__main__":
    main()

"""redis-py's transactions against a onekv cluster (run by crates/onekv/tests/redis_tools.rs).

    python3 transactions.py PORT_A PORT_B

PORT_A and PORT_B are the RESP ports of two different nodes. Checks, with redis-py's defaults:
pipeline() (a MULTI/EXEC transaction) with INCR/SET/GET; a runtime error inside EXEC leaving the
other commands applied; an error while queueing discarding the whole transaction; WATCH aborting
EXEC (WatchError) after another client's write; and two clients on two nodes incrementing one
counter 200 times each with a WATCH/MULTI/EXEC optimistic-lock loop, which must end at exactly 400.
Also keys that expire, as a cache uses them: set(ex=...), a pipeline of SET EX and EXPIRE, TTL read
through the other node, a key gone everywhere once its time comes, INCR keeping the TTL.
Prints one line of what it checked; any failure raises.
"""

import sys
import threading
import time

import redis

INCREMENTS = 200


def check_pipelines(r):
    pipe = r.pipeline()  # transaction=True by default: MULTI ... EXEC
    pipe.set("tx:a", "1").incr("tx:n").incr("tx:n").get("tx:n").get("tx:a")
    result = pipe.execute()
    assert result == [True, 1, 2, b"2", b"1"], result

    # A command failing at run time is its own error; the others still apply (as in Redis).
    r.set("tx:s", "text")
    pipe = r.pipeline()
    pipe.set("tx:b", "x").incr("tx:s").set("tx:c", "y")
    result = pipe.execute(raise_on_error=False)
    assert result[0] is True and result[2] is True, result
    assert isinstance(result[1], redis.ResponseError), result
    assert r.get("tx:b") == b"x" and r.get("tx:c") == b"y" and r.get("tx:s") == b"text"

    # A command refused while queueing (wrong arity) discards the whole transaction.
    pipe = r.pipeline()
    pipe.set("tx:d", "1")
    pipe.execute_command("GET")
    try:
        pipe.execute()
        raise AssertionError("EXEC of a transaction with a refused command succeeded")
    except redis.ResponseError as error:
        assert "wrong number of arguments" in str(error) or "EXECABORT" in str(error), error
    assert r.get("tx:d") is None, "a discarded transaction's command was applied"


def check_watch(r, other):
    r.set("tx:w", "0")
    with r.pipeline() as pipe:
        pipe.watch("tx:w")
        assert pipe.get("tx:w") == b"0"  # immediate mode after WATCH
        other.set("tx:w", "changed")
        pipe.multi()
        pipe.set("tx:w", "mine")
        try:
            pipe.execute()
            raise AssertionError("EXEC succeeded although a watched key changed")
        except redis.WatchError:
            pass
    assert r.get("tx:w") == b"changed"


def check_expiry(r, other):
    assert r.set("tx:cache", "v", ex=100) is True
    assert 95 <= other.ttl("tx:cache") <= 100, other.ttl("tx:cache")  # the same time on every node
    pipe = r.pipeline()
    pipe.set("tx:short", "s", px=300).incr("tx:count").expire("tx:count", 50).ttl("tx:count")
    result = pipe.execute()
    assert result[0] is True and result[2] is True and 45 <= result[3] <= 50, result
    assert r.incr("tx:count") and 45 <= r.ttl("tx:count") <= 50, "INCR dropped the TTL"
    assert r.get("tx:short") == b"s"
    time.sleep(0.4)
    assert r.get("tx:short") is None and other.get("tx:short") is None, "an expired key was read"
    assert r.ttl("tx:short") == -2 and r.persist("tx:cache") and r.ttl("tx:cache") == -1
    # redis-py's Lock (and go-redis's SetNX with a TTL): SET NX PX, so a crashed holder's lock ends.
    r.delete("tx:lock")
    assert r.set("tx:lock", "token", nx=True, px=30000) is True
    assert 25000 < r.pttl("tx:lock") <= 30000, r.pttl("tx:lock")
    assert r.set("tx:lock", "other", nx=True, px=30000) is None


def increment(port, retries, errors):
    try:
        client = redis.Redis(port=port)
        done = 0
        while done < INCREMENTS:
            with client.pipeline() as pipe:
                try:
                    pipe.watch("tx:counter")
                    value = int(pipe.get("tx:counter") or 0)
                    pipe.multi()
                    pipe.set("tx:counter", value + 1)
                    pipe.execute()
                    done += 1
                except redis.WatchError:
                    retries.append(port)
    except Exception as error:  # reported by the main thread
        errors.append(repr(error))


def main():
    port_a, port_b = int(sys.argv[1]), int(sys.argv[2])
    # RESP2 and RESP3 (redis-py 5 and later; older releases speak RESP2 only).
    for protocol in (2, 3):
        try:
            r = redis.Redis(port=port_a, protocol=protocol)
            other = redis.Redis(port=port_b, protocol=protocol)
        except TypeError:
            r, other = redis.Redis(port=port_a), redis.Redis(port=port_b)
        r.delete("tx:a", "tx:n", "tx:b", "tx:c", "tx:d", "tx:s", "tx:w", "tx:count")
        check_pipelines(r)
        check_watch(r, other)
        check_expiry(r, other)

    retries, errors = [], []
    threads = [threading.Thread(target=increment, args=(port, retries, errors)) for port in (port_a, port_b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    final = int(redis.Redis(port=port_a).get("tx:counter"))
    assert final == 2 * INCREMENTS, f"the counter is {final}, not {2 * INCREMENTS}"
    print(f"redis-py {redis.__version__} transactions ok: counter {final}, {len(retries)} WATCH retries")


if __name__ == "__main__":
    main()

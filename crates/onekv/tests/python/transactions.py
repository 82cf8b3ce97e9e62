"""redis-py's transactions against a onekv cluster (run by crates/onekv/tests/redis_tools.rs).

    python3 transactions.py PORT_A PORT_B

PORT_A and PORT_B are the RESP ports of two different nodes. Checks, with redis-py's defaults:
pipeline() (a MULTI/EXEC transaction) with INCR/SET/GET; a runtime error inside EXEC leaving the
other commands applied; an error while queueing discarding the whole transaction; WATCH aborting
EXEC (WatchError) after another client's write; and two clients on two nodes incrementing one
counter 200 times each with a WATCH/MULTI/EXEC optimistic-lock loop, which must end at exactly 400.
Also keys that expire, as a cache uses them: set(ex=...), a pipeline of SET EX and EXPIRE, TTL read
through the other node, a key gone everywhere once its time comes, INCR keeping the TTL. And
hashes: HSET/HGETALL/HMGET/HINCRBY/HSCAN and the rest, WRONGTYPE between strings and hashes, a
hash keeping its expiry, RENAME, DEL of an emptied hash, SCAN TYPE, hashes in a transaction, the
size bound, and concurrent HINCRBY through two nodes counting each success exactly once. And sets:
SADD/SMEMBERS/SINTER/SUNION/SDIFF/SSCAN/SPOP and the rest, WRONGTYPE, and sets in a transaction.
And lists: RPUSH/LPUSH/LRANGE/LINSERT/LSET/LREM/LTRIM/LPOP/RPOP, WRONGTYPE, a queue across nodes.
And sorted sets: ZADD (XX, CH), ZINCRBY, ZRANGE WITHSCORES, ZRANGEBYSCORE, ZRANK, ZSCAN, ZPOPMIN.
And Lua scripts: redis-py's Lock (its release and extend are scripts, sent by EVALSHA after a
NOSCRIPT), register_script() incrementing one counter from two nodes at once (exactly 200),
replies of every type, an undeclared key, EVAL_RO refusing a write, SCRIPT
EXISTS/FLUSH/KILL (a killed endless script has written nothing). And blocking pops: a BLPOP through
one node woken by an RPUSH through the other, BLMOVE, a timeout, and a client that leaves while
blocked, whose BLPOP must not take the next element.
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


def check_hashes(r, other):
    r.delete("h:user", "h:str", "h:tagged{x}", "h:moved{x}", "h:big", "h:counter")
    assert r.hset("h:user", mapping={"name": "ada", "age": "36"}) == 2
    assert r.hset("h:user", "age", "37") == 0  # an existing field: not new
    assert other.hgetall("h:user") == {b"age": b"37", b"name": b"ada"}  # a dict in RESP2 and RESP3
    assert other.hmget("h:user", ["name", "nope", "age"]) == [b"ada", None, b"37"]
    assert r.hlen("h:user") == 2 and r.hexists("h:user", "name") and not r.hexists("h:user", "x")
    assert r.hkeys("h:user") == [b"age", b"name"] and r.hvals("h:user") == [b"37", b"ada"]
    assert r.hincrby("h:user", "age", 5) == 42 and r.hincrbyfloat("h:user", "score", "1.5") == 1.5
    assert r.hstrlen("h:user", "name") == 3 and r.hsetnx("h:user", "name", "bob") == 0
    assert r.type("h:user") == b"hash" and r.exists("h:user") == 1
    assert dict(r.hscan_iter("h:user", match="a*")) == {b"age": b"42"}
    assert r.hrandfield("h:user") in (b"age", b"name", b"score")
    # Strings and hashes are distinct types, as in Redis.
    r.set("h:str", "text")
    for call in (lambda: r.hset("h:str", "f", "v"), lambda: r.hget("h:str", "f"), lambda: r.get("h:user"),
                 lambda: r.incr("h:user"), lambda: r.append("h:user", "x")):
        try:
            call()
            raise AssertionError("a command on the wrong type succeeded")
        except redis.ResponseError as error:
            assert str(error).startswith("WRONGTYPE"), error
    assert r.mget("h:user", "h:str") == [None, b"text"]  # MGET: nil for another type
    assert r.hget("h:user", "name") == b"ada", "a refused command changed the hash"
    try:
        r.set("h:str", b"\x00\xffonekv-hash\x00\x01fake")
        raise AssertionError("a string that would read as a hash was written")
    except redis.ResponseError as error:
        assert "reserved" in str(error), error
    # A hash keeps its expiry across writes, moves with RENAME, and goes with DEL.
    assert r.expire("h:user", 100) and r.hset("h:user", "new", "1") == 1 and 95 <= other.ttl("h:user") <= 100
    r.hset("h:tagged{x}", "a", "1")
    assert r.rename("h:tagged{x}", "h:moved{x}") and r.hgetall("h:moved{x}") == {b"a": b"1"}
    assert r.hdel("h:moved{x}", "a") == 1 and r.exists("h:moved{x}") == 0, "an emptied hash stays"
    assert b"h:user" in set(r.scan_iter(match="h:*", _type="hash"))
    assert b"h:str" not in set(r.scan_iter(match="h:*", _type="hash"))
    # In a transaction, with a string command failing on the hash at run time.
    pipe = r.pipeline()
    pipe.hset("h:user", "tx", "1").hincrby("h:user", "tx", 2).get("h:user").hget("h:user", "tx")
    result = pipe.execute(raise_on_error=False)
    assert result[0] == 1 and result[1] == 3 and isinstance(result[2], redis.ResponseError), result
    assert result[3] == b"3", result
    # A hash is one value: one over the value limit (1 MiB by default) is refused, nothing written.
    try:
        r.hset("h:big", mapping={f"f{i}": "v" * 6000 for i in range(200)})
        raise AssertionError("a hash over the value limit was written")
    except redis.ResponseError as error:
        assert "max_value_bytes" in str(error), error
    assert r.exists("h:big") == 0
    # Two clients on two nodes increment one field: every increment that succeeded counts once. (An
    # increment may give up under contention, applying nothing: docs/redis.md.)
    succeeded, errors = [], []

    def increments(client):
        for _ in range(100):
            try:
                client.hincrby("h:counter", "n", 1)
                succeeded.append(1)
            except redis.ResponseError as error:
                errors.append(str(error))

    threads = [threading.Thread(target=increments, args=(c,)) for c in (r, other)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all("try again" in error for error in errors), errors
    assert len(succeeded) >= 100, f"{len(succeeded)} of 200 increments succeeded: {errors[:3]}"
    assert r.hget("h:counter", "n") == str(len(succeeded)).encode(), (r.hget("h:counter", "n"), len(succeeded))
    r.delete("h:user", "h:str", "h:counter")


def check_sets(r, other):
    r.delete("s:a{s}", "s:b{s}", "s:str")
    assert r.sadd("s:a{s}", "x", "y", "z", "x") == 3 and r.sadd("s:b{s}", "y", "w") == 2
    assert other.smembers("s:a{s}") == {b"x", b"y", b"z"}  # a Python set in RESP2 and RESP3
    assert r.sismember("s:a{s}", "x") and not r.sismember("s:a{s}", "w") and r.scard("s:a{s}") == 3
    assert r.smismember("s:a{s}", ["x", "w"]) == [1, 0]
    assert r.sinter("s:a{s}", "s:b{s}") == {b"y"} and r.sunion("s:a{s}", "s:b{s}") == {b"w", b"x", b"y", b"z"}
    assert r.sdiff("s:a{s}", "s:b{s}") == {b"x", b"z"} and r.type("s:a{s}") == b"set"
    assert r.srem("s:b{s}", "y", "nope") == 1 and set(r.sscan_iter("s:a{s}", match="[xy]")) == {b"x", b"y"}
    assert r.srandmember("s:a{s}") in {b"x", b"y", b"z"} and len(r.srandmember("s:a{s}", -5)) == 5
    popped = r.spop("s:a{s}", 3)
    assert set(popped) == {b"x", b"y", b"z"} and r.exists("s:a{s}") == 0, "an emptied set stays"
    r.set("s:str", "text")
    for call in (lambda: r.sadd("s:str", "m"), lambda: r.get("s:b{s}"), lambda: r.hget("s:b{s}", "f")):
        try:
            call()
            raise AssertionError("a command on the wrong type succeeded")
        except redis.ResponseError as error:
            assert str(error).startswith("WRONGTYPE"), error
    # In a transaction.
    pipe = r.pipeline()
    pipe.sadd("s:a{s}", "1", "2").sinter("s:a{s}", "s:b{s}").scard("s:a{s}")
    assert pipe.execute() == [2, set(), 2]
    r.delete("s:a{s}", "s:b{s}", "s:str")


def check_lists(r, other):
    r.delete("l:q", "l:str")
    assert r.rpush("l:q", "a", "b") == 2 and r.lpush("l:q", "z") == 3
    assert other.lrange("l:q", 0, -1) == [b"z", b"a", b"b"] and r.llen("l:q") == 3 and r.lindex("l:q", -1) == b"b"
    assert r.linsert("l:q", "AFTER", "a", "x") == 4 and r.lset("l:q", 0, "first")
    assert r.lrem("l:q", 0, "x") == 1 and r.ltrim("l:q", 0, 1) and r.lrange("l:q", 0, -1) == [b"first", b"a"]
    assert r.type("l:q") == b"list" and r.lpop("l:q") == b"first" and r.rpop("l:q", 5) == [b"a"]
    assert r.exists("l:q") == 0 and r.lpop("l:q") is None and r.lpushx("l:q", "v") == 0
    r.set("l:str", "text")
    try:
        r.rpush("l:str", "v")
        raise AssertionError("RPUSH onto a string succeeded")
    except redis.ResponseError as error:
        assert str(error).startswith("WRONGTYPE"), error
    # A queue fed through one node and drained through the other, in a transaction.
    pipe = r.pipeline()
    pipe.rpush("l:q", "job1", "job2").llen("l:q")
    assert pipe.execute() == [2, 2]
    assert other.lpop("l:q") == b"job1" and other.lpop("l:q") == b"job2" and r.exists("l:q") == 0
    r.delete("l:str")


def check_sorted_sets(r, other):
    r.delete("z:board")
    assert r.zadd("z:board", {"ada": 10, "bob": 5.5, "cy": 7}) == 3
    assert r.zadd("z:board", {"bob": 8}, xx=True, ch=True) == 1 and r.zincrby("z:board", 1.5, "cy") == 8.5
    # redis-py gives (member, score) tuples in RESP2 and [member, score] lists in RESP3, as it does
    # against redis-server.
    ranked = [tuple(entry) for entry in other.zrange("z:board", 0, -1, withscores=True)]
    assert ranked == [(b"bob", 8.0), (b"cy", 8.5), (b"ada", 10.0)], ranked
    assert r.zrevrange("z:board", 0, 0) == [b"ada"] and r.zscore("z:board", "cy") == 8.5
    assert r.zrangebyscore("z:board", "(8", "+inf") == [b"cy", b"ada"] and r.zcount("z:board", 8, 9) == 2
    assert r.zrank("z:board", "ada") == 2 and r.zrevrank("z:board", "ada") == 0 and r.zcard("z:board") == 3
    assert r.type("z:board") == b"zset" and r.zscore("z:board", "nobody") is None
    assert dict(r.zscan_iter("z:board", match="[ab]*")) == {b"ada": 10.0, b"bob": 8.0}
    assert r.zpopmin("z:board") in ([(b"bob", 8.0)], [b"bob", 8.0]) and r.zrem("z:board", "cy", "ada") == 2
    assert r.exists("z:board") == 0, "an emptied sorted set stays"
    try:
        r.zadd("z:board", {"x": "nan"})
        raise AssertionError("a NaN score was accepted")
    except redis.ResponseError as error:
        assert "not a valid float" in str(error), error


def check_scripts(r, other):
    r.delete("sc:lock", "sc:n", "sc:undeclared", "sc:killed")
    r.script_flush()
    other.script_flush()
    # redis-py's Lock: acquire is SET NX PX; release and extend are Lua scripts (EVALSHA, and on
    # NOSCRIPT, SCRIPT LOAD then EVALSHA again).
    lock = r.lock("sc:lock", timeout=10)
    assert lock.acquire(blocking=False)
    rival = other.lock("sc:lock", timeout=10)
    assert not rival.acquire(blocking=False), "a held lock was acquired through another node"
    assert lock.extend(5)
    assert 10000 < r.pttl("sc:lock") <= 15000, r.pttl("sc:lock")
    lock.release()
    assert r.get("sc:lock") is None
    assert rival.acquire(blocking=False), "a released lock could not be taken"
    rival.release()
    # A lock whose key now holds another owner's token is not released (the script compares).
    assert lock.acquire(blocking=False)
    r.set("sc:lock", "another-owner")
    try:
        lock.release()
        raise AssertionError("a lock owned by another token was released")
    except redis.exceptions.LockNotOwnedError:
        pass
    assert r.get("sc:lock") == b"another-owner"

    # One script incrementing one counter from two nodes at once: atomic, every call counted once.
    script = "local n = tonumber(redis.call('GET', KEYS[1]) or '0') redis.call('SET', KEYS[1], n + 1) return n + 1"
    counts = []

    def run_script(client):
        increment_by_script = client.register_script(script)
        for _ in range(100):
            counts.append(increment_by_script(keys=["sc:n"]))

    threads = [threading.Thread(target=run_script, args=(c,)) for c in (r, other)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert r.get("sc:n") == b"200", r.get("sc:n")
    assert sorted(counts) == list(range(1, 201)), "each run saw the count before it exactly once"

    # Replies of each type, a key the script did not declare, and the errors.
    reply = r.eval("return {1, 'two', redis.status_reply('THREE'), false, 4.7}", 0)
    assert reply == [1, b"two", b"THREE", None, 4], reply
    r.set("sc:undeclared", "found")
    assert r.eval("return redis.call('GET', 'sc:undeclared')", 0) == b"found"
    sha = r.script_load("return ARGV[1] .. KEYS[1]")
    assert r.script_exists(sha, "0" * 40) == [True, False]
    assert r.evalsha(sha, 1, "k", "v") == b"vk"
    r.script_flush()
    try:
        r.evalsha(sha, 1, "k", "v")
        raise AssertionError("EVALSHA of a flushed script ran")
    except redis.exceptions.NoScriptError:
        pass
    try:
        r.eval_ro("return redis.call('SET', KEYS[1], 'x')", 1, "sc:ro")
        raise AssertionError("EVAL_RO wrote")
    except redis.ResponseError as error:
        assert "read-only" in str(error), error
    try:
        r.eval("return redis.call('INCR', KEYS[1])", 1, "sc:undeclared")
        raise AssertionError("INCR of a string succeeded")
    except redis.ResponseError as error:
        assert "not an integer" in str(error) and "script:" in str(error), error

    # SCRIPT KILL stops an endless script on this node; it has written nothing.
    try:
        r.script_kill()
        raise AssertionError("SCRIPT KILL with nothing running succeeded")
    except redis.ResponseError as error:
        assert "NOTBUSY" in str(error), error
    outcome = []

    def endless():
        try:
            redis.Redis(port=r.connection_pool.connection_kwargs["port"]).eval(
                "redis.call('SET', KEYS[1], 'x') while true do end", 1, "sc:killed"
            )
            outcome.append("returned")
        except redis.ResponseError as error:
            outcome.append(str(error))

    thread = threading.Thread(target=endless)
    thread.start()
    for _ in range(100):
        time.sleep(0.05)
        try:
            r.script_kill()
            break
        except redis.ResponseError:
            continue  # not running yet
    thread.join(timeout=30)
    assert outcome and "killed" in outcome[0], outcome
    assert r.get("sc:killed") is None, "a killed script's write was applied"
    # A client that leaves while its script runs stops the script.
    import socket
    with socket.create_connection(("127.0.0.1", r.connection_pool.connection_kwargs["port"])) as raw:
        raw.sendall(b"*3\r\n$4\r\nEVAL\r\n$17\r\nwhile true do end\r\n$1\r\n0\r\n")
        time.sleep(0.3)
    time.sleep(0.5)
    try:
        r.script_kill()
        raise AssertionError("the script of a client that left still runs")
    except redis.ResponseError as error:
        assert "NOTBUSY" in str(error), error
    r.delete("sc:n", "sc:undeclared", "sc:lock")


def check_blocking(r, other):
    r.delete("bq:jobs", "{bq}src", "{bq}dst", "bq:ghost")
    got = []
    consumer = threading.Thread(target=lambda: got.append(other.blpop(["bq:jobs"], timeout=10)))
    consumer.start()
    time.sleep(0.3)
    assert not got, got
    r.rpush("bq:jobs", "job-1")
    consumer.join(timeout=15)
    assert got == [(b"bq:jobs", b"job-1")] or got == [[b"bq:jobs", b"job-1"]], got
    r.rpush("{bq}src", "x", "y")
    assert r.blmove("{bq}src", "{bq}dst", 1, "LEFT", "RIGHT") == b"x"
    assert r.brpoplpush("{bq}src", "{bq}dst", 1) == b"y"
    assert r.lrange("{bq}dst", 0, -1) == [b"y", b"x"]  # BRPOPLPUSH pushes at the head
    started = time.monotonic()
    assert r.blpop(["bq:none"], timeout=0.3) is None
    assert time.monotonic() - started >= 0.25
    # A client that leaves while blocked: its BLPOP is dropped with it, and takes nothing later.
    port = r.connection_pool.connection_kwargs["port"]
    import socket
    with socket.create_connection(("127.0.0.1", port)) as raw:
        raw.sendall(b"*3\r\n$5\r\nBLPOP\r\n$8\r\nbq:ghost\r\n$1\r\n0\r\n")
        time.sleep(0.3)
    time.sleep(0.3)
    r.rpush("bq:ghost", "kept")
    time.sleep(0.5)
    assert r.lrange("bq:ghost", 0, -1) == [b"kept"], "a departed client's BLPOP popped an element"
    r.delete("{bq}dst", "bq:ghost")


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
        check_hashes(r, other)
        check_sets(r, other)
        check_lists(r, other)
        check_sorted_sets(r, other)
        check_scripts(r, other)
        check_blocking(r, other)

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

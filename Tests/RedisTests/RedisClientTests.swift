import TestSupport
import Logging
import NIOCore
import NIOPosix
import Testing

@testable import Redis

@Suite("Redis client against redis-server", .serialized, .timeLimit(.minutes(1)))
struct RedisClientTests {
    /// Commands get seconds by default (the suites share 2 loaded cores); the timeout test passes its own.
    static func client(_ port: Int, password: String? = nil, database: Int = 0, timeout: TimeAmount = .seconds(3)) throws -> RedisClient {
        try RedisClient(configuration: .init(host: "127.0.0.1", port: port, password: password, database: database, commandTimeout: timeout,
                                             minimumBackoff: .milliseconds(20), maximumBackoff: .milliseconds(200)),
                        group: MultiThreadedEventLoopGroup.singleton, logger: Logger(label: "test"))
    }

    @Test("strings, integers, nil, arrays, binary values and error replies")
    func commands() async throws {
        let server = try RedisServerProcess()
        defer { server.stop() }
        let redis = try Self.client(server.port)
        #expect(try await redis.send(["SET", "k", .bytes([0, 13, 10, 255])]) == .simpleString("OK"))
        #expect(try await redis.send(["GET", "k"]) == .bulkString([0, 13, 10, 255]))
        #expect(try await redis.send(["GET", "missing"]).isNull)
        #expect(try await redis.send(["SADD", "s", "a", "b"]).int == 2)
        let members = try await redis.send(["SMEMBERS", "s"])
        guard case .array(let list?) = members else { Issue.record("not an array"); return }
        #expect(Set(list.compactMap(\.string)) == ["a", "b"])
        await #expect(throws: RedisError.self) { try await redis.send(["INCR", "s"]) }
        do {
            _ = try await redis.send(["INCR", "s"])
        } catch let error as RedisError {
            guard case .server(let reply) = error else { Issue.record("\(error)"); return }
            #expect(reply.message.hasPrefix("WRONGTYPE") && reply.kind == .other, "an error of the command itself")
        }
        await redis.close()
    }

    @Test("500 concurrent commands are pipelined and each gets its own reply")
    func pipelining() async throws {
        let server = try RedisServerProcess()
        defer { server.stop() }
        let redis = try Self.client(server.port)
        let values = try await withThrowingTaskGroup(of: Int64.self) { group in
            for _ in 0..<500 { group.addTask { try await redis.send(["INCR", "counter"]).int ?? -1 } }
            return try await group.reduce(into: [Int64]()) { $0.append($1) }
        }
        #expect(Set(values) == Set(1...500))
        await redis.close()
    }

    @Test("password and database come from the configuration")
    func authAndDatabase() async throws {
        let server = try RedisServerProcess(arguments: ["--requirepass", "s3cret"])
        defer { server.stop() }
        let db2 = try Self.client(server.port, password: "s3cret", database: 2)
        let db0 = try Self.client(server.port, password: "s3cret")
        _ = try await db2.send(["SET", "where", "two"])
        #expect(try await db2.send(["GET", "where"]).string == "two")
        #expect(try await db0.send(["GET", "where"]).isNull)
        let wrong = try Self.client(server.port, password: "nope")
        await #expect(throws: RedisError.self) { try await wrong.send(["PING"]) }
        for client in [db2, db0, wrong] { await client.close() }
    }

    @Test("a script runs by its SHA-1; a server without it (new, or its scripts flushed) is sent the text once")
    func scriptsBySHA() async throws {
        let server = try RedisServerProcess()
        defer { server.stop() }
        let redis = try Self.client(server.port)
        let script = RedisScript("return {KEYS[1], ARGV[1]}")
        #expect(script.sha1 == "d006f1a90249474274c76f5be725b8f5804a346b")
        let loaded = try await redis.send(["SCRIPT", "LOAD", .string(script.source)]).string
        #expect(loaded == script.sha1, "Redis names the script as we do")
        _ = try await redis.send(["SCRIPT", "FLUSH"])
        func calls(_ command: String) async throws -> Int {
            let stats = try await redis.send(["INFO", "commandstats"]).string ?? ""
            guard let line = stats.split(separator: "\r\n").first(where: { $0.hasPrefix("cmdstat_\(command):calls=") }) else { return 0 }
            return Int(line.dropFirst("cmdstat_\(command):calls=".count).prefix { $0.isNumber }) ?? -1
        }
        let expected: RESPValue = .array([.bulkString(Array("k".utf8)), .bulkString(Array("v".utf8))])
        for _ in 0..<3 { #expect(try await redis.eval(script, keys: ["k"], arguments: ["v"], on: MultiThreadedEventLoopGroup.singleton.next()).get() == expected) }
        #expect(try await calls("eval") == 1, "the text once, after the first NOSCRIPT")
        #expect(try await calls("evalsha") == 3)
        _ = try await redis.send(["SCRIPT", "FLUSH"])
        #expect(try await redis.eval(script, keys: ["k"], arguments: ["v"], on: MultiThreadedEventLoopGroup.singleton.next()).get() == expected)
        #expect(try await calls("eval") == 2, "flushed: the text once more")
        await #expect(throws: RedisError.self) {
            try await redis.eval(RedisScript("return redis.call('SET', KEYS[1])"), keys: ["k"], on: MultiThreadedEventLoopGroup.singleton.next()).get()
        }
        await redis.close()
    }

    @Test("Redis back: once one event loop's connection reaches it, the loops backing off dial at once instead of after their backoff")
    func recoveryReachesEveryLoop() async throws {
        let server = try RedisServerProcess()
        defer { server.stop() }
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 3)
        let loops = Array(group.makeIterator())
        // A backoff longer than the test: a loop that failed would not dial again by itself.
        let redis = try RedisClient(configuration: .init(host: "127.0.0.1", port: server.port, commandTimeout: .seconds(3),
                                                         minimumBackoff: .seconds(60), maximumBackoff: .seconds(60)),
                                    group: group, logger: Logger(label: "test"))
        server.stop()
        for loop in loops.prefix(2) {
            await #expect(throws: RedisError.self) { try await redis.send(["PING"], on: loop).get() }
            await #expect(throws: RedisError.unavailable) { try await redis.send(["PING"], on: loop).get() }  // backing off
        }
        try server.start()
        #expect(try await redis.send(["PING"], on: loops[2]).get() == .simpleString("PONG"), "a loop that never failed dials")
        // The news was queued on each loop before that PING was written: a command there now
        // comes after it.
        for loop in loops.prefix(2) {
            #expect(try await redis.send(["PING"], on: loop).get() == .simpleString("PONG"), "dialled without waiting out its 60 s backoff")
        }
        await redis.close()
        try await group.shutdownGracefully()
    }

    @Test("a slow command times out within the command timeout; the connection keeps working")
    func timeout() async throws {
        let server = try RedisServerProcess()
        defer { server.stop() }
        let redis = try Self.client(server.port, timeout: .milliseconds(100))
        // Connected and answering first: on 2 loaded cores one PING may exceed 100 ms.
        var connected = false
        for _ in 0..<20 where !connected { connected = (try? await redis.send(["PING"])) != nil }
        try #require(connected)
        let start = ContinuousClock.now
        await #expect(throws: RedisError.timeout) { try await redis.send(["DEBUG", "SLEEP", "2"]) }
        #expect(ContinuousClock.now - start < .milliseconds(1500), "answered by the 100 ms timeout, not by Redis after 2 s")
        // Replies stay matched to their commands after a timed-out one (Redis is busy ~2 s more).
        var answered = false
        for _ in 0..<80 where !answered {
            if let pong = try? await redis.send(["ECHO", "after"]), pong.string == "after" { answered = true }
        }
        #expect(answered)
        await redis.close()
    }

    @Test("Redis down: calls fail fast as unavailable; back up: the client reconnects by itself")
    func reconnect() async throws {
        let server = try RedisServerProcess()
        defer { server.stop() }
        let redis = try Self.client(server.port, timeout: .milliseconds(500))
        _ = try await redis.send(["SET", "a", "1"])
        server.stop()
        // The loss is noticed by the connection or, at worst, by the command timeout (500 ms):
        // never a hang. Either way the caller gets a classified error to answer 503 with.
        let start = ContinuousClock.now
        do {
            _ = try await redis.send(["GET", "a"])
            Issue.record("answered while Redis is down")
        } catch let error as RedisError {
            #expect(error == .unavailable || error == .timeout, "\(error)")
        }
        #expect(ContinuousClock.now - start < .milliseconds(1500))
        try server.start()
        var recovered = false
        for _ in 0..<200 where !recovered {
            if (try? await redis.send(["PING"])) == .simpleString("PONG") { recovered = true }
            else { try await Task.sleep(for: .milliseconds(10)) }  // pacing against the client's own reconnect backoff
        }
        #expect(recovered)
        await redis.close()
    }
}

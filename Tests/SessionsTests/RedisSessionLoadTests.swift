import Logging
import NIOCore
import NIOPosix
import Redis
@testable import Sessions
import TestSupport
import Testing

/// The Redis store's cache-miss read (issue 12 §3): the session, its user's profile and
/// revocation marker in one round trip, and the same answer without scripts for an ACL user
/// that may not run them.
@Suite("Redis session store: one round trip per miss", .timeLimit(.minutes(1)))
struct RedisSessionLoadTests {
    /// How often each command ran since the last `CONFIG RESETSTAT` (`INFO commandstats`).
    static func calls(_ admin: RedisClient) async throws -> [String: Int] {
        let info = try await admin.send(["INFO", "commandstats"]).string ?? ""
        var calls: [String: Int] = [:]
        for line in info.split(whereSeparator: \.isNewline) where line.hasPrefix("cmdstat_") {
            let name = line.dropFirst("cmdstat_".count).prefix { $0 != ":" }
            if let range = line.range(of: "calls="), let n = Int(line[range.upperBound...].prefix { $0.isNumber }) { calls[String(name)] = n }
        }
        return calls
    }

    /// Runs `body` with a client of `server`, closed before this returns or rethrows.
    static func withClient<Result>(_ server: RedisServerProcess, user: String? = nil, password: String? = nil,
                                   _ body: (RedisClient) async throws -> Result) async throws -> Result {
        let client = try RedisClient(configuration: .init(host: "127.0.0.1", port: server.port, username: user, password: password, commandTimeout: .seconds(3)),
                                     group: MultiThreadedEventLoopGroup.singleton, logger: Logger(label: "test"))
        return try await withTeardown(client, stop: { await $0.close() }, body)
    }

    static func storeAndRead(_ store: RedisSessionStore, _ admin: RedisClient) async throws -> (StoredSession?, [String: Int]) {
        let loop = MultiThreadedEventLoopGroup.singleton.next()
        let now = SessionClock.now()
        let (_, s) = record("user.miss", created: now - 1000)
        try await store.create(s, profile: UserProfile(sub: "user.miss", name: "Grace Hopper", email: "grace@example.com"), expiresAt: now + 60_000, on: loop).get()
        _ = try await admin.send(["SET", "sg:revoked:{user.miss}", .string("\(now - 2000)")])
        _ = try await admin.send(["CONFIG", "RESETSTAT"])
        let loaded = try await store.load(s.handle, on: loop).get()
        #expect(try await store.load(record("user.miss", created: now).record.handle, on: loop).get() == nil, "an unknown session")
        return (loaded, try await calls(admin))
    }

    @Test("a miss reads the session, the profile and the revocation marker with one command")
    func oneRoundTrip() async throws {
        let server = try RedisServerProcess()
        defer { server.stop() }
        try await Self.withClient(server) { client in
            try await Self.withClient(server) { admin in
                let (loaded, calls) = try await Self.storeAndRead(RedisSessionStore(client: client), admin)
                let session = try #require(loaded)
                #expect(session.user.name == "Grace Hopper" && session.user.email == "grace@example.com")
                #expect(session.revokedAt != nil)
                // Two loads (one found, one unknown): one command each, whatever the script did
                // inside: the script by its SHA-1, its text once (the server had not seen it).
                #expect(calls["evalsha"] == 2, "\(calls)")
                #expect(calls["eval"] == 1, "\(calls)")
            }
        }
    }

    enum ScriptsRefused: String, CaseIterable, CustomTestStringConvertible, Sendable {
        /// An ACL user without `+@scripting`: NOPERM.
        case acl
        /// `rename-command EVAL ""`: ERR unknown command.
        case renamed
        var testDescription: String { rawValue }
    }

    @Test("where scripts are refused (an ACL user without +@scripting, EVAL renamed away), the same answer in two round trips",
          arguments: ScriptsRefused.allCases)
    func withoutScripts(_ refusal: ScriptsRefused) async throws {
        let server = try RedisServerProcess(arguments: refusal == .acl
            ? ["--user", "gateway", "on", ">pw", "~*", "&*", "+@all", "-@scripting"]
            : ["--rename-command", "EVAL", ""])
        defer { server.stop() }
        let (user, password) = refusal == .acl ? ("gateway", "pw") : (nil, nil) as (String?, String?)
        try await Self.withClient(server, user: user, password: password) { client in
            try await Self.withClient(server) { admin in
                let (loaded, calls) = try await Self.storeAndRead(RedisSessionStore(client: client), admin)
                let session = try #require(loaded)
                #expect(session.user.name == "Grace Hopper")
                #expect(session.revokedAt != nil)
                #expect((calls["eval"] ?? 0) == 0, "refused once, then not tried again: \(calls)")
                #expect(calls["hgetall"] == 3, "\(calls)")
            }
        }
    }
}


@Suite("A session hash read in place")
struct HashReplyTests {
    @Test("numbers from bytes are canonical decimals, read as integer replies are", arguments: [
        ("1732550400000", Int64(1_732_550_400_000)), ("0", 0), ("-5", -5), ("", nil), ("-", nil), ("12a", nil), (" 1", nil),
        ("+1", nil), ("007", nil), ("-0", nil), ("9223372036854775807", .max), ("-9223372036854775808", .min),
        ("9223372036854775808", nil),
    ] as [(String, Int64?)])
    func numbers(_ text: String, expected: Int64?) {
        #expect(HashReply(.array([.bulkString(Array("n".utf8)), .bulkString(Array(text.utf8))]))?.int64("n") == expected)
    }

    @Test("fields are found by their names' bytes; absent ones are nil; an odd reply is no hash")
    func fields() throws {
        func bulk(_ s: String) -> RESPValue { .bulkString(Array(s.utf8)) }
        let hash = try #require(HashReply(.array([bulk("sub"), bulk("001.a"), bulk("created"), bulk("42"), bulk("email_verified"), bulk("true"),
                                                   bulk("subject"), bulk("other")])))
        #expect(hash.string("sub") == "001.a")
        #expect(hash.int64("created") == 42)
        #expect(hash.flag("email_verified") == true)
        #expect(hash.string("subj") == nil, "a prefix of a name is not the name")
        #expect(hash.string("name") == nil)
        #expect(HashReply(.array([bulk("sub")])) == nil)
        #expect(HashReply(.bulkString(nil)) == nil)
    }
}

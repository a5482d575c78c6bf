import Foundation
import Testing
import TestSupport

/// `check --online` proves the store as `serve` will use it (issue 28 §1): the realistic Redis
/// mistakes that used to pass `check` and then answer 503 on every guarded route are each named
/// with their step and key, at the key's line. Real `redis-server`s, the real binary.
@Suite("check --online: the store (process)", .serialized, .timeLimit(.minutes(3)))
struct StoreOnlineCheckTests {
    struct Run {
        let status: Int32
        let output: [String]
        /// The line about the store (a failed connection's log line may come before it).
        var store: String? { output.first { $0.hasPrefix("FILE:") || $0.hasPrefix("ok: store") } }
    }

    /// Runs `check --online` on a file whose `store:` section is `store` (indented by two).
    static func check(_ store: String) async throws -> Run {
        let directory = NSTemporaryDirectory() + "store-check-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let path = directory + "/sessiongate.yaml"
        try """
            server:
              listen: "127.0.0.1:\(try closedPort())"
              admin_listen: "127.0.0.1:\(try closedPort())"
            store:
            \(store.split(separator: "\n").map { "  " + $0 }.joined(separator: "\n"))
            routes:
              - name: a
                upstream: "http://127.0.0.1:1"
                auth: public
            """.write(toFile: path, atomically: true, encoding: .utf8)
        let process = try GatewayProcess(arguments: ["check", "--online", "--config", path])
        let status = await process.waitForExit()
        await process.waitForOutputEnd()
        return Run(status: status, output: process.output.map { $0.replacingOccurrences(of: path, with: "FILE") })
    }

    @Test("a password, an ACL user, a database and a key prefix: each mistake names its step and key")
    func credentialsAndPermissions() async throws {
        try await withTeardown(try RedisServerProcess(arguments: ["--requirepass", "secret"]), stop: { $0.stop() }) { redis in
            let admin = try RedisCommand.Connection(port: redis.port, password: "secret")
            for rule in [["noscript", "+@all", "-@scripting"], ["reader", "+@read", "+@connection", "+select"], ["elsewhere", "+@all"]] {
                let keys = rule[0] == "elsewhere" ? "~other:*" : "~*"
                #expect(try admin.send(["ACL", "SETUSER", rule[0], "on", ">pw", keys, "&*"] + Array(rule.dropFirst())) == .string("OK"))
            }
            let url = { (credentials: String, database: Int) in "redis_url: \"redis://\(credentials)@127.0.0.1:\(redis.port)/\(database)\"" }

            let good = try await Self.check(url(":secret", 0))
            #expect(good.status == 0, "\(good.output)")
            #expect(good.store?.hasPrefix("ok: store: Redis at redis://…:\(redis.port)/0: connected, wrote, read and deleted sg:check:{…}, loaded the scripts") == true,
                    "\(good.output)")

            let cases: [(store: String, line: String)] = [
                (url(":wrong", 0), "FILE:5:3: error: store.redis_url: connect: Redis refused the user or password in the URL (WRONGPASS"),
                (url("nobody:pw", 0), "FILE:5:3: error: store.redis_url: connect: Redis refused the user or password in the URL (WRONGPASS"),
                (url(":secret", 99), "FILE:5:3: error: store.redis_url: connect: Redis has no database 99 (ERR DB index is out of range"),
                (url("noscript:pw", 0), "FILE:5:3: error: store.redis_url: scripts: the Redis user's ACL does not allow it (NOPERM"),
                (url("reader:pw", 0), "FILE:5:3: error: store.redis_url: write: the Redis user's ACL does not allow it (NOPERM"),
                (url("elsewhere:pw", 0), "FILE:5:3: error: store.redis_url: write: the Redis user's ACL does not allow it (NOPERM"),
                ("redis_url: \"redis://127.0.0.1:\(try closedPort())/0\"", "FILE:5:3: error: store.redis_url: connect: cannot reach Redis"),
            ]
            for (store, line) in cases {
                let run = try await Self.check(store)
                #expect(run.status == 1)
                #expect(run.store?.hasPrefix(line) == true, "\(store): \(run.output)")
                #expect(!run.output.contains("ok"))
            }
        }
    }

    @Test("rediss: a CA that did not sign the server, and mutual TLS without our certificate, each name their key")
    func tls() async throws {
        let (ours, theirs) = (try TestCA(name: "Redis CA"), try TestCA(name: "Another CA"))
        defer { ours.remove(); theirs.remove() }
        let server = try ours.issue("redis")
        let client = try ours.issue("gateway")
        let tls = RedisServerProcess.TLS(certificateFile: server.certificateFile, privateKeyFile: server.privateKeyFile, caFile: ours.certificateFile, authClients: true)
        try await withTeardown(try RedisServerProcess(tls: tls), stop: { $0.stop() }) { redis in
            let url = "redis_url: \"rediss://127.0.0.1:\(redis.port)/0\""
            let good = try await Self.check(url + "\ntls: { ca_file: \"\(ours.certificateFile)\", certificate_file: \"\(client.certificateFile)\", private_key_file: \"\(client.privateKeyFile)\" }")
            #expect(good.status == 0, "\(good.output)")
            #expect(good.store?.hasPrefix("ok: store: Redis at rediss://") == true, "\(good.output)")

            let otherCA = try await Self.check(url + "\ntls: { ca_file: \"\(theirs.certificateFile)\", certificate_file: \"\(client.certificateFile)\", private_key_file: \"\(client.privateKeyFile)\" }")
            #expect(otherCA.status == 1)
            #expect(otherCA.store?.hasPrefix("FILE:6:10: error: store.tls.ca_file: connect: the server's certificate is not signed by this CA") == true, "\(otherCA.output)")

            let noCertificate = try await Self.check(url + "\ntls: { ca_file: \"\(ours.certificateFile)\" }")
            #expect(noCertificate.status == 1)
            #expect(noCertificate.store?.contains("error: store.tls.certificate_file: connect: the TLS handshake failed; a server with tls-auth-clients needs our client certificate") == true,
                    "\(noCertificate.output)")
        }
    }

    @Test("a master name the sentinels do not know is named at store.sentinel.master_name")
    func sentinelMasterName() async throws {
        try await withTeardown(try await blocking { try RedisSentinelCluster() }, stop: { $0.stop() }) { sentinels in
            let addresses = sentinels.sentinelPorts.map { "\"127.0.0.1:\($0)\"" }.joined(separator: ", ")
            let run = { (name: String) in try await Self.check("redis_url: \"redis://127.0.0.1:1/0\"\nsentinel: { master_name: \"\(name)\", addresses: [\(addresses)] }") }
            let good = try await run(sentinels.masterName)
            #expect(good.status == 0, "\(good.output)")
            #expect(good.store?.hasPrefix("ok: store: Redis behind Sentinel (\(sentinels.masterName))") == true, "\(good.output)")
            let wrong = try await run("nosuchmaster")
            #expect(wrong.status == 1)
            #expect(wrong.store?.hasPrefix("FILE:6:15: error: store.sentinel.master_name: connect: no sentinel knows a master named 'nosuchmaster'") == true, "\(wrong.output)")
        }
    }
}

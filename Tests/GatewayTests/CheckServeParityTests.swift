import Crypto
import Foundation
import Testing
import TestSupport

/// `check` says what `serve` will say (issue 10 §2): for each file `serve` refuses, `check`
/// refuses it too, with the same `file:line:col: error: key: …` line; for a good file both agree
/// it is fine.
@Suite("check and serve agree (process)", .serialized, .timeLimit(.minutes(3)))
struct CheckServeParityTests {
    /// A configuration with sign-in; `edit` changes its text.
    static func yaml(directory: String, listen: Int, admin: Int, edit: (String) -> String = { $0 }) -> String {
        edit("""
            server:
              listen: "127.0.0.1:\(listen)"
              admin_listen: "127.0.0.1:\(admin)"
              public_url: "http://localhost:\(listen)"
            apple:
              team_id: "ABCDE12345"
              client_ids: ["com.example.web"]
              key_id: "KEY1234567"
              private_key_file: "\(directory)/AuthKey.p8"
              base_url: "http://127.0.0.1:1"
            session:
              secret_file: "\(directory)/session.key"
            store:
              timeout: 250ms
            routes:
              - name: app
                upstream: "http://127.0.0.1:9000"
            """)
    }

    struct Run { let status: Int32; let output: [String] }

    static func run(_ arguments: [String]) async throws -> Run {
        let process = try GatewayProcess(arguments: arguments)
        let status = await process.waitForExit()
        await process.waitForOutputEnd()
        return Run(status: status, output: process.output)
    }

    @Test("each file serve refuses, check refuses with the same line", arguments: [
        ("a missing .p8", "AuthKey.p8\"", "Missing.p8\"", 9, "apple.private_key_file: cannot read", ""),
        ("a .p8 that is not a key", "AuthKey.p8\"", "session.key\"", 9, "apple.private_key_file: the Sign in with Apple key is not a PEM", ""),
        ("a missing session secret", "session.key\"", "nothing.key\"", 12, "session.secret_file: cannot read", "No such file or directory"),
        ("an unset env: secret", "\"DIR/session.key\"", "\"env:SESSIONGATE_TEST_UNSET\"", 12, "session.secret_file: cannot read env:SESSIONGATE_TEST_UNSET: the variable is not set", ""),
        ("a secret shorter than 32 bytes", "session.key\"", "short.key\"", 12, "session.secret_file: ", "32"),
        ("a directory as the secret", "session.key\"", "secrets\"", 12, "session.secret_file: cannot read", "it is a directory"),
        ("an upstream that does not resolve", "http://127.0.0.1:9000", "http://no-such-host.invalid:9000", 17, "routes[0].upstream: the host 'no-such-host.invalid' does not resolve", ""),
        ("admin_listen equal to listen", "admin_listen: \"127.0.0.1:ADMIN\"", "admin_listen: \"127.0.0.1:LISTEN\"", 3, "server.admin_listen: 127.0.0.1:", "is the public listener's address"),
        ("a rediss:// CA file that is missing", "  timeout: 250ms", "  redis_url: \"rediss://127.0.0.1:6380/0\"\n  tls: { ca_file: \"/nonexistent/ca.pem\" }", 15, "store.tls.ca_file: cannot read /nonexistent/ca.pem", "No such file or directory"),
        ("a state directory that is not there", "  timeout: 250ms", "  timeout: 250ms\n  state_dir: \"/nonexistent/sessiongate\"", 15,
         "store.state_dir: /nonexistent/sessiongate is not a directory", ""),
        ("a Redis host that does not resolve", "  timeout: 250ms", "  redis_url: \"redis://no-such-host.invalid:6379/0\"", 14, "store.redis_url: the host 'no-such-host.invalid' does not resolve", ""),
        ("a Redis Cluster node that does not resolve", "  timeout: 250ms", "  redis_url: \"redis://127.0.0.1:1/0\"\n  cluster: { addresses: [\"127.0.0.1:7000\", \"no-such-host.invalid:7001\"] }", 15,
         "store.cluster.addresses: a cluster node does not resolve", ""),
    ])
    func refusedByBoth(name: String, from: String, to: String, line: Int, message: String, detail: String) async throws {
        let directory = try makeSecretsDirectory("parity")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try FileManager.default.createDirectory(atPath: directory + "/secrets", withIntermediateDirectories: true)
        try "too short".write(toFile: directory + "/short.key", atomically: true, encoding: .utf8)
        let (listen, admin) = (try closedPort(), try closedPort())
        let from = from.replacingOccurrences(of: "DIR", with: directory).replacingOccurrences(of: "ADMIN", with: "\(admin)")
        let to = to.replacingOccurrences(of: "LISTEN", with: "\(listen)")
        let text = Self.yaml(directory: directory, listen: listen, admin: admin) { yaml in
            #expect(yaml.contains(from), "the case edits the file")
            return yaml.replacingOccurrences(of: from, with: to)
        }
        let path = directory + "/sessiongate.yaml"
        try text.write(toFile: path, atomically: true, encoding: .utf8)

        let check = try await Self.run(["check", "--config", path])
        let serve = try await Self.run(["serve", "--config", path])
        #expect(check.status == 1, "\(name): \(check.output)")
        #expect(serve.status == 1, "\(name): \(serve.output)")
        let prefix = "\(path):\(line):"
        for (command, run) in [("check", check), ("serve", serve)] {
            let found = run.output.first { $0.hasPrefix(prefix) && $0.contains("error: \(message)") && (detail.isEmpty || $0.contains(detail)) }
            #expect(found != nil, "\(name): \(command) printed \(run.output)")
        }
        #expect(!serve.output.contains { $0.contains("sessiongate listening") })
    }

    @Test("a listen address in use: both name the key and the address; check --reload and the --transfer report skip the bind")
    func addressInUse() async throws {
        let directory = try makeSecretsDirectory("parity")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        // Someone else listens on the public port.
        let (fd, busy) = boundLoopbackSocket()
        #expect(listen(fd, 8) == 0)
        defer { close(fd) }
        let path = directory + "/sessiongate.yaml"
        try Self.yaml(directory: directory, listen: busy, admin: try closedPort()).write(toFile: path, atomically: true, encoding: .utf8)

        let check = try await Self.run(["check", "--config", path])
        let serve = try await Self.run(["serve", "--config", path])
        let expected = "\(path):2:3: error: server.listen: 127.0.0.1:\(busy): address already in use"
        #expect(check.status == 1)
        #expect(check.output.contains(expected), "\(check.output)")
        #expect(serve.status == 1)
        #expect(serve.output.contains { $0.contains(expected) }, "\(serve.output)")
        let reload = try await Self.run(["check", "--reload", "--config", path])
        #expect(reload.status == 0 && reload.output.last == "ok", "\(reload.output)")
        let report = try await Self.run(["check", "--transfer", "--config", path])  // on the live host
        #expect(report.status == 0 && report.output.last == "ok", "\(report.output)")
        #expect(report.output.contains { $0.contains("store.redis_url is not set") }, "the checklist is printed: \(report.output)")
    }

    @Test("a good file: check prints ok and serve starts")
    func goodFile() async throws {
        let directory = try makeSecretsDirectory("parity")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let reserved = (ReservedPort(), ReservedPort())
        defer { withExtendedLifetime(reserved) {} }
        let yaml = Self.yaml(directory: directory, listen: reserved.0.port, admin: reserved.1.port)
        let path = directory + "/sessiongate.yaml"
        try yaml.write(toFile: path, atomically: true, encoding: .utf8)
        let check = try await Self.run(["check", "--config", path])
        #expect(check.status == 0 && check.output.last == "ok", "\(check.output)")
        try await GatewayProcess.with(arguments: ["serve", "--config", path]) { serve in
            _ = try await serve.ports()
            serve.signal(SIGTERM)
            #expect(await serve.waitForExit() == 0)
        }
    }
}

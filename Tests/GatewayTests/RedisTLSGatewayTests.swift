import Foundation
import Testing
import TestSupport

/// rediss:// through the real binary (issue 11 §3): a server whose certificate the configured CA
/// did not sign is refused with a clear log line and `/readyz` 503; with the right CA and a
/// client certificate (mutual TLS) the gateway is ready and `sessiongate sessions` works too.
@Suite("Redis over TLS (process)", .serialized, .timeLimit(.minutes(3)))
struct RedisTLSGatewayTests {
    static func yaml(directory: String, redisPort: Int, ca: String, client: TestCA.Leaf?) -> String {
        var store = "  timeout: 2s\n  tls:\n    ca_file: \"\(ca)\""
        if let client {
            store += "\n    certificate_file: \"\(client.certificateFile)\"\n    private_key_file: \"\(client.privateKeyFile)\""
        }
        return redisGatewayYAML(directory: directory, redisURL: "rediss://127.0.0.1:\(redisPort)/0", store: store)
    }

    static func readyz(_ admin: Int) async throws -> (Int, String) {
        try await blocking {
            let c = try RawClient(port: admin)
            try c.send("GET /readyz HTTP/1.1\r\nHost: a\r\n\r\n")
            let r = try c.readResponse()
            return (r.status, String(decoding: r.body, as: UTF8.self))
        }
    }

    @Test("a wrong CA is refused with a clear error and /readyz 503; the right CA with a client certificate is ready")
    func wrongAndRightCA() async throws {
        let ca = try TestCA()
        let other = try TestCA(name: "Some Other CA")
        defer { ca.remove(); other.remove() }
        let directory = try makeSecretsDirectory("redis-tls")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let leaf = try ca.issue("redis")
        let redis = try RedisServerProcess(tls: .init(certificateFile: leaf.certificateFile, privateKeyFile: leaf.privateKeyFile,
                                                      caFile: ca.certificateFile, authClients: true))
        defer { redis.stop() }
        let client = try ca.issue("gateway", dnsNames: [], ipAddresses: [])

        // The wrong CA: the handshake fails, the log says why, the gateway is not ready.
        let refused = try GatewayProcess.serve(yaml: Self.yaml(directory: directory, redisPort: redis.port, ca: other.certificateFile, client: client))
        defer { refused.signal(SIGKILL) }
        let ports = try await refused.ports()
        let line = await refused.waitForLine(containing: "TLS handshake with redis failed", timeout: 20)
        #expect(line != nil, "\(refused.output.suffix(5))")
        let (status, body) = try await Self.readyz(ports.admin)
        #expect(status == 503, "\(body)")
        refused.signal(SIGTERM)
        _ = await refused.waitForExit()

        // The right CA and the client certificate: ready; the sessions command reaches Redis too.
        let path = "\(directory)/good.yaml"
        try Self.yaml(directory: directory, redisPort: redis.port, ca: ca.certificateFile, client: client).write(toFile: path, atomically: true, encoding: .utf8)
        let good = try GatewayProcess(arguments: ["serve", "--config", path], configPath: path)
        defer { good.signal(SIGKILL) }
        let goodPorts = try await good.ports()
        var ready = (0, "")
        for _ in 0..<50 where ready.0 != 200 {
            ready = try await Self.readyz(goodPorts.admin)
            if ready.0 != 200 { try await Task.sleep(for: .milliseconds(100)) }
        }
        #expect(ready.0 == 200, "\(ready.1) \(good.output.suffix(5))")
        let listed = try await CheckServeParityTests.run(["sessions", "list", "--sub", "nobody", "--config", path])
        #expect(listed.status == 0, "\(listed.output)")
        #expect(listed.output.contains { $0.contains("no live sessions for nobody") }, "\(listed.output)")

        // Without the client certificate, the server refuses the gateway (mutual TLS).
        try Self.yaml(directory: directory, redisPort: redis.port, ca: ca.certificateFile, client: nil).write(toFile: path, atomically: true, encoding: .utf8)
        let anonymous = try await CheckServeParityTests.run(["sessions", "list", "--sub", "nobody", "--config", path])
        #expect(anonymous.status != 0, "\(anonymous.output)")
    }
}

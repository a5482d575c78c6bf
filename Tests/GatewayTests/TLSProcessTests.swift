import AsyncHTTPClient
import Foundation
import NIOCore
import NIOSSL
import Testing
import TestSupport

/// TLS against the real binary (issue 11 §1–2): the listener terminates TLS 1.2/1.3 with ALPN
/// http/1.1, tells the app `X-Forwarded-Proto: https`, answers plain HTTP on its TLS port with a
/// plain 400, bounds and counts failed handshakes, re-reads its certificate on SIGHUP (a bad
/// pair keeps the old one), redirects its plain-HTTP listener with 308; https upstreams are
/// verified against a CA file, by name or by address, and never without.
@Suite("TLS (process)", .serialized, .timeLimit(.minutes(3)))
struct TLSProcessTests {
    static func yaml(directory: String, listen: Int, redirect: Int, upstream: Int, secureUpstream: Int, ca: String) -> String {
        """
        server:
          listen: "127.0.0.1:\(listen)"
          admin_listen: "127.0.0.1:0"
          public_url: "https://localhost:\(listen)"
          redirect_http_listen: "127.0.0.1:\(redirect)"
          access_log: "off"
          log: { level: debug }
          tls:
            certificate_file: "\(directory)/server.pem"
            private_key_file: "\(directory)/server.key"
          timeouts:
            tls_handshake: 1s
        routes:
          - name: secure
            path_prefix: /secure/
            upstream: "https://127.0.0.1:\(secureUpstream)"
            upstream_ca_file: "\(ca)"
            upstream_server_name: "upstream.test"
            auth: public
          - name: by-address
            path_prefix: /by-address/
            upstream: "https://127.0.0.1:\(secureUpstream)"
            upstream_ca_file: "\(ca)"
            auth: public
          - name: system-store
            path_prefix: /system-store/
            upstream: "https://127.0.0.1:\(secureUpstream)"
            upstream_server_name: "upstream.test"
            auth: public
          - name: app
            upstream: "http://127.0.0.1:\(upstream)"
            auth: public

        """
    }

    /// `openssl s_client` against the listener: its output (subject, protocol, ALPN).
    static func handshake(port: Int, ca: String, extra: [String] = []) async throws -> String {
        try await output(of: "/usr/bin/openssl", ["s_client", "-connect", "127.0.0.1:\(port)", "-CAfile", ca, "-verify_return_error", "-alpn", "http/1.1"] + extra)
    }

    /// Runs a program to its end; what it wrote (standard output and error).
    static func output(of executable: String, _ arguments: [String]) async throws -> String {
        try await blocking {
            let process = Process()
            process.executableURL = URL(fileURLWithPath: executable)
            process.arguments = arguments
            let output = Pipe()
            process.standardOutput = output
            process.standardError = output
            process.standardInput = FileHandle.nullDevice
            try process.run()
            let data = output.fileHandleForReading.readDataToEndOfFile()
            process.waitUntilExit()
            return String(decoding: data, as: UTF8.self)
        }
    }

    static func client(trusting ca: String) throws -> HTTPClient {
        var tls = TLSConfiguration.makeClientConfiguration()
        tls.trustRoots = .certificates(try NIOSSLCertificate.fromPEMFile(ca))
        return HTTPClient(eventLoopGroupProvider: .singleton, configuration: .init(tlsConfiguration: tls, redirectConfiguration: .disallow))
    }

    static func metrics(admin: Int) async throws -> String {
        try await blocking {
            let c = try RawClient(port: admin)
            try c.send("GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n")
            return String(decoding: try c.readResponse().body, as: UTF8.self)
        }
    }

    static func install(_ leaf: TestCA.Leaf, key: TestCA.Leaf? = nil, in directory: String) throws {
        for (from, to) in [(leaf.certificateFile, "server.pem"), ((key ?? leaf).privateKeyFile, "server.key")] {
            let data = try Data(contentsOf: URL(fileURLWithPath: from))
            try data.write(to: URL(fileURLWithPath: "\(directory)/\(to)"), options: .atomic)
        }
    }

    @Test("terminates TLS, refuses what is not TLS, reloads its certificate, redirects plain HTTP, verifies https upstreams")
    func termination() async throws {
        let ca = try TestCA()
        defer { ca.remove() }
        let directory = try makeSecretsDirectory("tls")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let first = try ca.issue("first")
        let second = try ca.issue("second")
        // The upstream's certificate names it only by DNS name: verification by address fails.
        let upstreamLeaf = try ca.issue("upstream", dnsNames: ["upstream.test"], ipAddresses: [])
        let upstreamTLS = try NIOSSLContext(configuration: .makeServerConfiguration(
            certificateChain: try NIOSSLCertificate.fromPEMFile(upstreamLeaf.certificateFile).map { .certificate($0) },
            privateKey: .privateKey(try NIOSSLPrivateKey(file: upstreamLeaf.privateKeyFile, format: .pem))))
        try await TestUpstream.with { plain in
            try await TestUpstream.with(tls: upstreamTLS) { secure in
                try Self.install(first, in: directory)

                let reserved = (ReservedPort(), ReservedPort())
                defer { withExtendedLifetime(reserved) {} }
                let (listen, redirect) = (reserved.0.port, reserved.1.port)
                let yaml = Self.yaml(directory: directory, listen: listen, redirect: redirect, upstream: plain.port, secureUpstream: secure.port, ca: ca.certificateFile)
                let gateway = try GatewayProcess.serve(yaml: yaml)
                defer { gateway.signal(SIGKILL) }
                let ports = try await gateway.ports()
                #expect(ports.proxy == listen)
                try await withTeardown(Self.client(trusting: ca.certificateFile), stop: { try? await $0.shutdown() }) { http in

                    // TLS to the app: X-Forwarded-Proto says https.
                    let echo = try await http.get(url: "https://localhost:\(listen)/echo").get()
                    #expect(echo.status == .ok)
                    let echoed = String(buffer: echo.body ?? ByteBuffer()).lowercased()
                    #expect(echoed.contains("x-forwarded-proto: https"), "\(echoed)")

                    // The handshake: TLS 1.2 or 1.3, ALPN http/1.1, the first certificate; TLS 1.1 refused.
                    let hello = try await Self.handshake(port: listen, ca: ca.certificateFile)
                    #expect(hello.contains("CN = first"), "\(hello)")
                    #expect(hello.contains("ALPN protocol: http/1.1"), "\(hello)")
                    #expect(hello.contains("Verify return code: 0 (ok)"), "\(hello)")
                    let old = try await Self.handshake(port: listen, ca: ca.certificateFile, extra: ["-tls1_1"])
                    #expect(!old.contains("CN = first"), "\(old)")

                    // Plain HTTP on the TLS port: a plain 400 from the gateway, nothing to the app.
                    let requestsBefore = plain.stats.withLockedValue { $0.requests }
                    let refused = try await blocking {
                        let c = try RawClient(port: listen)
                        try c.send("GET /echo HTTP/1.1\r\nHost: localhost\r\n\r\n")
                        return try c.readResponse()
                    }
                    #expect(refused.status == 400)
                    #expect(String(decoding: refused.body, as: UTF8.self).contains("speaks HTTPS"))
                    #expect(plain.stats.withLockedValue { $0.requests } == requestsBefore)

                    // A client that never says hello is closed after tls_handshake (1 s).
                    let closed = try await blocking {
                        let c = try RawClient(port: listen, timeoutSeconds: 10)
                        return c.waitForClose()
                    }
                    #expect(closed)
                    // A client that closes TCP without TLS's close_notify (common) is not a malformed request.
                    let abrupt = try await Self.output(of: "/usr/bin/python3", ["-c", """
                        import socket, ssl
                        context = ssl.create_default_context(cafile="\(ca.certificateFile)")
                        s = context.wrap_socket(socket.create_connection(("127.0.0.1", \(listen))), server_hostname="localhost")
                        s.sendall(b"GET /echo HTTP/1.1\\r\\nHost: localhost\\r\\n\\r\\n")
                        print(s.recv(12).decode())
                        s.close()
                        """])
                    #expect(abrupt.hasPrefix("HTTP/1.1 200"), "\(abrupt)")
                    let counted = try await Self.metrics(admin: ports.admin)
                    #expect(counted.contains(#"sessiongate_requests_total{route="-",status_class="4xx"} 0"#), "an unclean TLS close is not answered 400")
                    #expect(counted.contains(#"sessiongate_tls_handshake_failures_total{reason="plaintext"} 1"#), "\(counted)")
                    #expect(counted.contains(#"sessiongate_tls_handshake_failures_total{reason="timeout"} 1"#), "\(counted)")
                    #expect(!counted.contains(#"sessiongate_tls_handshake_failures_total{reason="handshake"} 0"#), "the TLS 1.1 hello is counted")
                    #expect(counted.contains("sessiongate_tls_certificate_expiry_timestamp_seconds"))

                    // https upstreams: verified by name with the CA file; by address the name does not
                    // match; without the CA file the system store does not know the test CA.
                    let verified = try await http.get(url: "https://localhost:\(listen)/secure/echo").get()
                    #expect(verified.status == .ok)
                    let byAddress = try await http.get(url: "https://localhost:\(listen)/by-address/echo").get()
                    #expect(byAddress.status == .badGateway)
                    let untrusted = try await http.get(url: "https://localhost:\(listen)/system-store/echo").get()
                    #expect(untrusted.status == .badGateway)
                    #expect(await gateway.waitForLine(containing: "upstream TLS handshake failed", timeout: 10) != nil)
                    let upstreamErrors = try await Self.metrics(admin: ports.admin)
                    #expect(upstreamErrors.contains(#"sessiongate_upstream_errors_total{route="system-store",kind="tls_handshake"} 1"#), "\(upstreamErrors)")
                    // Keep-alive to an https upstream: a second request reuses the pooled connection.
                    let connections = secure.stats.withLockedValue { $0.connections }
                    #expect(try await http.get(url: "https://localhost:\(listen)/secure/echo").get().status == .ok)
                    #expect(secure.stats.withLockedValue { $0.connections } == connections)

                    // SIGHUP re-reads the pair: new connections get the second certificate.
                    try Self.install(second, in: directory)
                    let reloaded = try await gateway.reload(yaml: yaml)
                    #expect(reloaded?.contains("configuration reloaded") == true, "\(reloaded ?? "-")")
                    #expect(try await Self.handshake(port: listen, ca: ca.certificateFile).contains("CN = second"))

                    // A key that does not fit the certificate refuses the reload; the second pair stays.
                    try Self.install(first, key: second, in: directory)
                    let mark = gateway.output.count
                    let rejected = try await gateway.reload(yaml: yaml)
                    #expect(rejected?.contains("configuration reload rejected") == true, "\(rejected ?? "-")")
                    let reason = gateway.output.dropFirst(mark).first { $0.contains("server.tls.private_key_file") }
                    #expect(reason?.contains("does not belong to the certificate") == true, "\(gateway.output.suffix(5))")
                    #expect(reason?.contains(":10:") == true, "the error points at the key's line: \(reason ?? "-")")
                    #expect(try await Self.handshake(port: listen, ca: ca.certificateFile).contains("CN = second"))

                    // The plain-HTTP listener: 308 to https, path and query kept; a foreign Host goes to
                    // public_url's host.
                    for (host, expected) in [("localhost:\(redirect)", "https://localhost:\(listen)/a/b?c=1"), ("evil.example", "https://localhost:\(listen)/a/b?c=1")] {
                        let moved = try await blocking {
                            let c = try RawClient(port: redirect)
                            try c.send("POST /a/b?c=1 HTTP/1.1\r\nHost: \(host)\r\nContent-Length: 0\r\n\r\n")
                            return try c.readResponse()
                        }
                        #expect(moved.status == 308)
                        #expect(moved.header("location") == expected)
                    }
                }
            }
        }
    }

    @Test("check reads the pair: expired and mismatched are errors, close to expiry a warning")
    func check() async throws {
        let ca = try TestCA()
        defer { ca.remove() }
        let directory = try makeSecretsDirectory("tls-check")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let good = try ca.issue("good")
        let other = try ca.issue("other")
        let expired = try ca.issue("expired", validFor: 10, startingDaysAgo: 40)
        let soon = try ca.issue("soon", validFor: 6, startingDaysAgo: 1)
        let cases: [(TestCA.Leaf, TestCA.Leaf?, Int32, String)] = [
            (good, nil, 0, "ok"),
            (good, other, 1, "server.tls.private_key_file: \(directory)/server.key: the key does not belong to the certificate"),
            (expired, nil, 1, "server.tls.certificate_file: \(directory)/server.pem: the certificate expired on"),
            (soon, nil, 0, "warning: server.tls.certificate_file: \(directory)/server.pem: the certificate expires in "),
        ]
        for (leaf, key, status, expected) in cases {
            try Self.install(leaf, key: key, in: directory)
            let path = "\(directory)/check.yaml"
            try Self.yaml(directory: directory, listen: try closedPort(), redirect: try closedPort(), upstream: 9, secureUpstream: 9, ca: ca.certificateFile)
                .write(toFile: path, atomically: true, encoding: .utf8)
            let run = try await CheckServeParityTests.run(["check", "--config", path])
            #expect(run.status == status, "\(run.output)")
            #expect(run.output.contains { $0.contains(expected) }, "\(expected) in \(run.output)")
        }
    }
}

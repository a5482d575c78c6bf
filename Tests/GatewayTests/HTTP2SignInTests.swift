import Foundation
import Testing

@testable import Gateway
import TestSupport

/// The whole product over HTTP/2 (h2c, spoken by `curl`): a session made by the web sign-in is
/// admitted on an HTTP/2 stream exactly as on HTTP/1.1.
@Suite("Sign-in and admission over HTTP/2", .serialized, .timeLimit(.minutes(2)))
struct HTTP2SignInTests {
    /// `curl --http2-prior-knowledge` with `headers`: the body, then the HTTP version and status.
    static func curl(_ url: String, headers: [String]) async throws -> String {
        try await blocking {
            let process = Process()
            process.executableURL = URL(fileURLWithPath: "/usr/bin/curl")
            process.arguments = ["-s", "--max-time", "10", "--http2-prior-knowledge", "-w", "\n%{http_version} %{http_code}"]
                + headers.flatMap { ["-H", $0] } + [url]
            let output = Pipe()
            process.standardOutput = output
            process.standardError = FileHandle.nullDevice
            try process.run()
            let data = output.fileHandleForReading.readDataToEndOfFile()
            process.waitUntilExit()
            return String(decoding: data, as: UTF8.self)
        }
    }

    @Test("a session cookie sent in split cookie fields admits the HTTP/2 request; the app gets the identity, never the client's spoofed one")
    func signedInOverHTTP2() async throws {
        try await SignInHarness.with(configure: { $0.server.http2Cleartext = true }) { h in
            let sub = h.simulator.createUser(privateEmail: false, firstName: "Ada", lastName: "Lovelace")
            let browser = TestBrowser(gatewayOrigin: h.origin)
            _ = try await browser.signIn(from: "/dashboard", as: sub)
            let session = try #require(browser.cookies["__Host-sessiongate"])

            let answer = try await Self.curl(h.origin + "/echo?x=1", headers: [
                "cookie: theme=dark", "cookie: __Host-sessiongate=\(session)", "x-auth-user: evil", "x_auth_user: evil2", "remote-user: admin",
            ])
            #expect(answer.hasSuffix("\n2 200"), "\(answer)")
            #expect(answer.contains("X-Auth-User: \(sub)\n"), "\(answer)")
            #expect(!answer.contains("evil") && !answer.contains("remote-user") && !answer.lowercased().contains("x_auth_user"), "\(answer)")
            #expect(answer.contains("cookie: theme=dark\n"), "the gateway's cookie is removed from what the app sees: \(answer)")

            // Without the session: the guarded route refuses, as on HTTP/1.1.
            let refused = try await Self.curl(h.origin + "/api/x", headers: ["cookie: theme=dark", "accept: application/json"])
            #expect(refused.hasSuffix("\n2 401"), "\(refused)")
        }
    }
}

import Foundation
import NIOHTTP1
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// `conf/nginx-forward-auth.conf` as shipped (ports replaced): nginx asks SessionGate's
/// `/_auth/check` for every request and passes the identity on to the app.
@Suite("nginx auth_request in front of the app", .serialized, .timeLimit(.minutes(1)))
struct ForwardAuthTests {
    @Test func nginxForwardAuth() async throws {
        let h = try await SignInHarness.start()
        defer { Task { await h.stop() } }
        let nginxPort = try closedPort()
        let directory = NSTemporaryDirectory() + "nginx-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory + "/logs", withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let example = try String(contentsOfFile: "\(repositoryRoot)/conf/nginx-forward-auth.conf", encoding: .utf8)
            .replacingOccurrences(of: "127.0.0.1:8080", with: "127.0.0.1:\(h.gatewayPort)")
            .replacingOccurrences(of: "127.0.0.1:9000", with: "127.0.0.1:\(h.upstream.port)")
            .replacingOccurrences(of: "listen 80;", with: "listen 127.0.0.1:\(nginxPort);")
        try """
            daemon on;
            pid \(directory)/nginx.pid;
            error_log \(directory)/error.log warn;
            events { worker_connections 64; }
            http {
              access_log off;
              \(example)
            }
            """.write(toFile: directory + "/nginx.conf", atomically: true, encoding: .utf8)
        // nginx daemonizes: the command returns once it listens.
        let status = try await blocking { runToCompletion("/usr/sbin/nginx", ["-c", directory + "/nginx.conf", "-p", directory]) }
        try #require(status == 0, "nginx did not start: \((try? String(contentsOfFile: directory + "/error.log", encoding: .utf8)) ?? "")")
        defer {
            if let pid = (try? String(contentsOfFile: directory + "/nginx.pid", encoding: .utf8)).flatMap({ Int32($0.trimmingCharacters(in: .whitespacesAndNewlines)) }) {
                kill(pid, SIGTERM)
            }
        }

        // A session (native sign-in straight at the gateway), then requests through nginx.
        let sub = h.simulator.createUser()
        let app = TestBrowser(gatewayOrigin: h.origin)
        let credential = try h.simulator.nativeAuthorization(sub: sub, clientID: SignInHarness.appClient, nonce: "n")
        let signedIn = try await app.request("/_auth/native", method: .POST, json: #"{"identity_token":"\#(credential.identityToken)","authorization_code":"\#(credential.authorizationCode)","nonce":"n","user":{"name":{"firstName":"Ada","lastName":"L"}}}"#)
        let token = try #require((try JSONSerialization.jsonObject(with: Data(signedIn.body.utf8)) as? [String: Any])?["token"] as? String)
        let viaNginx = TestBrowser(gatewayOrigin: "http://127.0.0.1:\(nginxPort)")

        let admitted = try await viaNginx.request("/reports", headers: [("cookie", "__Host-sessiongate=\(token)"), ("X-Auth-Email", "spoof@example.com")])
        #expect(admitted.status == 200)
        let seen = h.upstream.stats.withLockedValue { $0.lastHeaders }
        #expect(seen["x-auth-user"] == [sub] && seen["x-auth-name"] == ["Ada%20L"])
        #expect(seen["x-auth-email"] != ["spoof@example.com"], "the client's header is replaced")

        let before = h.upstream.stats.withLockedValue { $0.requests }
        let anonymous = try await viaNginx.request("/reports?q=1", headers: [("X-Auth-User", "admin"), ("X_Auth_User", "admin")])
        #expect(anonymous.status == 302 && anonymous.location?.hasSuffix("/_auth/sign-in?rd=/reports?q=1") == true)
        let forged = try await viaNginx.request("/reports", headers: [("cookie", "__Host-sessiongate=\(String(repeating: "A", count: 86))")])
        #expect(forged.status == 302)
        #expect(h.upstream.stats.withLockedValue { $0.requests } == before, "nothing unauthenticated reached the app")
        let page = try await viaNginx.request("/_auth/sign-in?rd=/reports")
        #expect(page.status == 200 && page.body.contains("Sign in with Apple"))
    }
}

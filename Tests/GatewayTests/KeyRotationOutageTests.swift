import Foundation
import TestSupport
import Testing

/// Apple rotates its signing key while its key endpoint is down: a genuine token names a key
/// the gateway has never seen and cannot fetch. That is "Apple unavailable", not a forgery.
@Suite("Apple's key rotated during a key-endpoint outage")
struct KeyRotationOutageTests {
    @Test("native sign-in with a token signed by the new key is 502 apple_unavailable while the key endpoint fails (5xx, 429), never 401; it signs in once the endpoint answers",
          arguments: [503, 500, 429])
    func nativeSignIn(failure: Int) async throws {
        try await SignInHarness.with { h in
            let app = TestBrowser(gatewayOrigin: h.origin)
            func signIn(_ sub: String, nonce: String) async throws -> (Int, String) {
                let credential = try h.simulator.nativeAuthorization(sub: sub, clientID: SignInHarness.appClient, nonce: nonce)
                let body = #"{"identity_token":"\#(credential.identityToken)","authorization_code":"\#(credential.authorizationCode)","nonce":"\#(nonce)"}"#
                let response = try await app.request("/_auth/native", method: .POST, headers: [("accept", "application/json")], json: body)
                return (response.status, response.body)
            }
            #expect(try await signIn(h.simulator.createUser(), nonce: "n-0").0 == 200, "the key set is fetched")

            _ = try h.simulator.rotateKeys()
            h.simulator.setFaults { $0.keysFailureStatus = failure }
            let sub = h.simulator.createUser()
            let (status, body) = try await signIn(sub, nonce: "n-1")
            #expect(status == 502 && body.contains(#""error":"apple_unavailable""#), "\(failure): \(status) \(body)")

            h.simulator.setFaults { $0.keysFailureStatus = nil }
            // The failed refetch is tried again a second later: polled, since the wait is the key set's own.
            var attempt = 1
            let signedIn = try await firstTime(200, within: .seconds(10), every: .milliseconds(200)) {
                attempt += 1
                return try await signIn(sub, nonce: "n-\(attempt)").0
            }
            #expect(signedIn != nil, "signs in once Apple's key endpoint answers")
        }
    }
}

import AsyncHTTPClient
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import NIOPosix
import Testing

@testable import AppleID
@testable import AppleIDSimulator

extension TokenFixture {
    /// POSTs a raw form to the simulator; returns the status and the `error` (or the JSON).
    func post(_ path: String, _ form: String, contentType: String = "application/x-www-form-urlencoded", headers: [(String, String)] = []) async throws -> (Int, [String: Any]) {
        var request = HTTPClientRequest(url: simulator.baseURL + path)
        request.method = .POST
        request.headers.add(name: "content-type", value: contentType)
        for (n, v) in headers { request.headers.add(name: n, value: v) }
        request.body = .bytes(ByteBuffer(string: form))
        let response = try await client.execute(request, timeout: .seconds(5))
        let body = try await response.body.collect(upTo: 1 << 20)
        let json = (try? JSONSerialization.jsonObject(with: Data(body.readableBytesView))) as? [String: Any] ?? [:]
        return (Int(response.status.code), json)
    }

    func secret(_ clientID: String = TokenFixture.web) throws -> String { try team.minter().secret(for: clientID) }
}

@Suite("Simulator contract: token endpoint order, §12 variants, user migration", .serialized)
struct SimulatorContractTests {
    @Test("/auth/token checks in Apple's order")
    func evaluationOrder() async throws {
        try await TokenFixture.with { f in
            let web = TokenFixture.web
            let good = try f.secret()
            let cases: [(String, String, String, String)] = [
                ("JSON instead of a form", #"{"client_id":"x"}"#, "application/json", "invalid_request"),
                ("no client_secret", "client_id=\(web)&grant_type=refresh_token&refresh_token=r", "application/x-www-form-urlencoded", "invalid_request"),
                ("a duplicated field", "client_id=\(web)&client_id=\(web)&client_secret=\(good)&grant_type=refresh_token", "application/x-www-form-urlencoded", "invalid_request"),
                ("grant before client: bad secret, misspelled grant", "client_id=\(web)&client_secret=bad&grand_type=refresh_token", "application/x-www-form-urlencoded", "unsupported_grant_type"),
                ("unknown client", "client_id=com.nobody&client_secret=\(good)&grant_type=refresh_token&refresh_token=r", "application/x-www-form-urlencoded", "invalid_client"),
                ("client before grant: bad secret, bad code", "client_id=\(web)&client_secret=bad&grant_type=authorization_code&code=c", "application/x-www-form-urlencoded", "invalid_client"),
                ("then the grant", "client_id=\(web)&client_secret=\(good)&grant_type=authorization_code&code=c", "application/x-www-form-urlencoded", "invalid_grant"),
                ("client_credentials needs user.migration", "client_id=\(web)&client_secret=\(good)&grant_type=client_credentials&scope=email", "application/x-www-form-urlencoded", "invalid_scope"),
            ]
            for (name, form, type, expected) in cases {
                let (status, json) = try await f.post("/auth/token", form, contentType: type)
                #expect(status == 400, "\(name)")
                #expect(json["error"] as? String == expected, "\(name): \(json)")
            }
        }
    }

    @Test("§12 variants: invalid_request for a revoked refresh, strict client authentication, foreign revokes")
    func variants() async throws {
        try await TokenFixture.with { f in
            let refresh = try await f.refreshToken()
            let sub = f.simulator.grants.withLockedValue { $0.refreshTokens[refresh]!.sub }
            f.simulator.setFaults { $0.revokedRefreshError = "invalid_request" }
            f.simulator.revokeConsent(sub: sub)
            #expect(await f.tokens.refresh(token: refresh, clientID: TokenFixture.web) == .grantRevoked(error: "invalid_request"))

            let fresh = try await f.refreshToken()
            let form = "client_id=\(TokenFixture.web)&client_secret=\(try f.secret())&grant_type=refresh_token&refresh_token=\(fresh)"
            let basic = [("authorization", "Basic Y2xpZW50OnNlY3JldA==")]
            #expect(try await f.post("/auth/token", form, headers: basic).0 == 200, "lenient by default")
            f.simulator.setFaults { $0.strictClientAuthentication = true }
            #expect(try await f.post("/auth/token", form, headers: basic).1["error"] as? String == "invalid_request")

            let revokeAsApp = "client_id=\(TokenFixture.app)&client_secret=\(try f.secret(TokenFixture.app))&token=\(fresh)"
            #expect(try await f.post("/auth/revoke", revokeAsApp).1["error"] as? String == "invalid_grant")
            #expect(f.simulator.isRefreshTokenValid(fresh), "another client cannot revoke it")
            f.simulator.setFaults { $0.rejectForeignRevoke = false }
            #expect(try await f.post("/auth/revoke", revokeAsApp).0 == 200)
        }
    }

    @Test("user migration: transfer ids within 60 days, transfer_sub in tokens, the new sub for the receiving team")
    func migration() async throws {
        try await TokenFixture.with { f in
            let refresh = try await f.refreshToken()
            let sub = f.simulator.grants.withLockedValue { $0.refreshTokens[refresh]!.sub }
            let (_, credentials) = try await f.post("/auth/token", "client_id=\(TokenFixture.web)&client_secret=\(try f.secret())&grant_type=client_credentials&scope=user.migration")
            let access = try #require(credentials["access_token"] as? String)
            let bearer = [("authorization", "Bearer \(access)")]
            let ask = "client_id=\(TokenFixture.web)&client_secret=\(try f.secret())&sub=\(sub)&target=TEAMB12345"

            #expect(try await f.post("/auth/usermigrationinfo", ask, headers: bearer).1["error"] as? String == "invalid_request", "no transfer yet")
            f.simulator.completeTransfer(toTeam: "TEAMB12345")
            #expect(try await f.post("/auth/usermigrationinfo", ask, headers: []).1["error"] as? String == "invalid_request", "a bearer token is required")
            #expect(try await f.post("/auth/usermigrationinfo", ask.replacingOccurrences(of: "TEAMB12345", with: "TEAMC12345"), headers: bearer).1["error"] as? String == "invalid_request")
            let transferSub = try #require(try await f.post("/auth/usermigrationinfo", ask, headers: bearer).1["transfer_sub"] as? String)

            let code = f.simulator.issueCode(sub: sub, clientID: TokenFixture.web, redirectURI: TokenFixture.returnURL, nonce: nil)
            guard case .success(let tokens) = await f.tokens.exchange(code: code, clientID: TokenFixture.web, redirectURI: TokenFixture.returnURL) else { Issue.record("exchange"); return }
            let clock = f.clock
            let verifier = IdentityTokenVerifier(keySet: f.keySet, clientIDs: [TokenFixture.web], now: { clock.now })
            #expect(try await verifier.verify(try #require(tokens.idToken), expectedNonce: nil).transferSubject == transferSub)

            let (_, receiving) = try await f.post("/auth/usermigrationinfo", "client_id=\(TokenFixture.web)&client_secret=\(try f.secret())&transfer_sub=\(transferSub)", headers: bearer)
            let newSub = try #require(receiving["sub"] as? String)
            #expect(newSub != sub)
            #expect((receiving["email"] as? String)?.hasSuffix("@privaterelay.appleid.com") == true)
            #expect(receiving["is_private_email"] as? Bool == true)

            f.clock.advance(60 * 86_400)
            let later = "client_id=\(TokenFixture.web)&client_secret=\(try f.secret())&sub=\(sub)&target=TEAMB12345"
            #expect(try await f.post("/auth/usermigrationinfo", later, headers: bearer).1["error"] as? String == "invalid_request", "the window has closed")
            #expect(f.simulator.activeTransferID(for: sub, now: f.clock.now) == nil, "no more transfer_sub in tokens")
        }
    }
}

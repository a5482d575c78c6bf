import AsyncHTTPClient
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import NIOPosix
import TestSupport
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
                ("a value not percent-encoded", "client_id=\(web)&client_secret=\(good)&grant_type=refresh_token&refresh_token=a b", "application/x-www-form-urlencoded", "invalid_request"),
                ("a malformed escape", "client_id=\(web)&client_secret=\(good)&grant_type=refresh_token&refresh_token=%+f", "application/x-www-form-urlencoded", "invalid_request"),
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

    @Test("user migration between two teams: transfer ids before and within 60 days, transfer_sub in the recipient's tokens, every refusal")
    func migration() async throws {
        try await TokenFixture.with { f in
            // Team B: its own key and simulator, the same app, one ledger with team A.
            var teamB = TeamFixture()
            teamB.teamID = "TEAMB12345"
            teamB.clock = f.clock
            let clock = f.clock
            try await withTeardown(SimulatedAppleID.start(
                team: .init(teamID: teamB.teamID, keys: [teamB.keyID: teamB.key.publicKey], clients: [TokenFixture.web: [TokenFixture.returnURL]]),
                clock: { clock.now }, ledger: f.simulator.ledger), stop: { await $0.stop() }) { b in
                let bTokens = AppleTokenClient(baseURL: b.baseURL, httpClient: f.client, secrets: try teamB.minter(), logger: Logger(label: "b"))

                let refresh = try await f.refreshToken()
                let sub = f.simulator.grants.withLockedValue { $0.refreshTokens[refresh]!.sub }
                let revoked = f.simulator.createUser()
                guard case .success(let credentials) = await f.tokens.migrationAccessToken(clientID: TokenFixture.web) else { Issue.record("client_credentials"); return }
                let access = credentials.accessToken
                let bearer = [("authorization", "Bearer \(access)")]
                let ask = "client_id=\(TokenFixture.web)&client_secret=\(try f.secret())&sub=\(sub)&target=TEAMB12345"

                // Before the transfer: the sending team prepares transfer ids (TN3159).
                guard case .transferSubject(let transferSub) = await f.tokens.transferSubject(of: sub, target: "TEAMB12345", clientID: TokenFixture.web, accessToken: access) else {
                    Issue.record("a transfer id before the transfer"); return
                }
                #expect(await f.tokens.transferSubject(of: sub, target: "TEAMB12345", clientID: TokenFixture.web, accessToken: access) == .transferSubject(transferSub), "stable")
                let refusals: [(String, String, [(String, String)], String)] = [
                    ("no bearer token", ask, [], "invalid_request"),
                    ("another team's bearer token", ask, [("authorization", "Bearer a-not-ours")], "invalid_request"),
                    ("an unknown target team", ask.replacingOccurrences(of: "TEAMB12345", with: "TEAMC12345"), bearer, "invalid_request"),
                    ("our own team as target", ask.replacingOccurrences(of: "TEAMB12345", with: f.team.teamID), bearer, "invalid_request"),
                    ("a user who never consented", ask.replacingOccurrences(of: sub, with: revoked), bearer, "invalid_request"),
                    ("a bad client secret", "client_id=\(TokenFixture.web)&client_secret=bad&sub=\(sub)&target=TEAMB12345", bearer, "invalid_client"),
                    ("both forms at once", ask + "&transfer_sub=\(transferSub)", bearer, "invalid_request"),
                ]
                for (name, form, headers, error) in refusals {
                    let (status, json) = try await f.post("/auth/usermigrationinfo", form, headers: headers)
                    #expect(status == 400 && json["error"] as? String == error, "\(name): \(json)")
                }
                guard case .success(let bAccess) = await bTokens.migrationAccessToken(clientID: TokenFixture.web) else { Issue.record("B's client_credentials"); return }
                #expect(await bTokens.exchange(transferSubject: transferSub, clientID: TokenFixture.web, accessToken: bAccess.accessToken) == .refused(reason: "invalid_request"),
                        "the recipient cannot exchange before the transfer")

                SimulatedAppleID.transfer(from: f.simulator, to: b)
                #expect(await f.tokens.exchange(transferSubject: transferSub, clientID: TokenFixture.web, accessToken: access) == .refused(reason: "invalid_request"),
                        "the sending team cannot exchange: the id is for team B")
                guard case .subject(let newSub, let email, let privateEmail) = await bTokens.exchange(transferSubject: transferSub, clientID: TokenFixture.web, accessToken: bAccess.accessToken) else {
                    Issue.record("the exchange"); return
                }
                #expect(newSub != sub && privateEmail && email?.hasSuffix("@privaterelay.appleid.com") == true)
                #expect(email != f.simulator.grants.withLockedValue { $0.users[sub]?.email }, "a new relay address at the new team")

                // The user signs in at team B: the token carries the new sub and the transfer id.
                let code = b.issueCode(sub: newSub, clientID: TokenFixture.web, redirectURI: TokenFixture.returnURL, nonce: nil)
                guard case .success(let tokens) = await bTokens.exchange(code: code, clientID: TokenFixture.web, redirectURI: TokenFixture.returnURL) else { Issue.record("exchange at B"); return }
                let bKeys = AppleKeySet(baseURL: b.baseURL, httpClient: f.client, logger: Logger(label: "b"))
                let verifier = IdentityTokenVerifier(keySet: bKeys, clientIDs: [TokenFixture.web], now: { clock.now })
                let identity = try await verifier.verify(try #require(tokens.idToken), expectedNonce: nil)
                #expect(identity.subject == newSub && identity.transferSubject == transferSub)

                // A user who revokes at B before the exchange: invalid_request (TN3107).
                let other = f.simulator.createUser()
                _ = f.simulator.grants.withLockedValue { $0.users[other]?.authorized = true }
                guard case .transferSubject(let otherID) = await f.tokens.transferSubject(of: other, target: "TEAMB12345", clientID: TokenFixture.web, accessToken: access) else {
                    Issue.record("no transfer id: consent came with the transfer? \(other)"); return
                }
                #expect(await bTokens.exchange(transferSubject: otherID, clientID: TokenFixture.web, accessToken: bAccess.accessToken) == .refused(reason: "invalid_request"),
                        "a user who consented only after the transfer did not move")

                // The client_credentials token lives its expires_in (3600 s), then a new one is needed.
                f.clock.advance(3601)
                #expect(await bTokens.exchange(transferSubject: transferSub, clientID: TokenFixture.web, accessToken: bAccess.accessToken) == .refused(reason: "invalid_request"), "expired token")
                guard case .success(let renewed) = await bTokens.migrationAccessToken(clientID: TokenFixture.web) else { Issue.record("renewal"); return }
                #expect(await bTokens.exchange(transferSubject: transferSub, clientID: TokenFixture.web, accessToken: renewed.accessToken) == .subject(sub: newSub, email: email, privateEmail: true))

                f.clock.advance(60 * 86_400)
                guard case .success(let lateA) = await f.tokens.migrationAccessToken(clientID: TokenFixture.web),
                      case .success(let lateB) = await bTokens.migrationAccessToken(clientID: TokenFixture.web) else { Issue.record("tokens after the window"); return }
                #expect(await f.tokens.transferSubject(of: sub, target: "TEAMB12345", clientID: TokenFixture.web, accessToken: lateA.accessToken) == .refused(reason: "invalid_request"), "the window has closed")
                #expect(await bTokens.exchange(transferSubject: transferSub, clientID: TokenFixture.web, accessToken: lateB.accessToken) == .refused(reason: "invalid_request"))
                #expect(b.activeTransferID(for: newSub, now: f.clock.now) == nil, "no more transfer_sub in tokens")
            }
        }
    }
}

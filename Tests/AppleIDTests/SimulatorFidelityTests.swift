import AsyncHTTPClient
import Crypto
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import NIOPosix
import TestSupport
import Testing

@testable import AppleID
@testable import AppleIDSimulator

/// The simulator closer to Apple (issue 13 §6): what the relying party's tests can catch.
@Suite("Simulator fidelity (real HTTP)", .serialized, .timeLimit(.minutes(1)))
struct SimulatorFidelityTests {
    /// The claims of a compact JWS, unverified (the verifier tests check signatures).
    static func claims(_ token: String) -> [String: Any] {
        let part = token.split(separator: ".").dropFirst().first.map(String.init) ?? ""
        return (CompactJWS.decodeBase64URL(Substring(part)).flatMap { try? JSONSerialization.jsonObject(with: Data($0)) as? [String: Any] }) ?? [:]
    }

    static func formField(_ name: String, in page: String) -> String? {
        guard let range = page.range(of: #"name="\#(name)" value=""#) else { return nil }
        return String(page[range.upperBound...].prefix { $0 != "\"" })
    }

    @Test("consent per app group: a native sign-in, then the web one: the user JSON once; real_user_status only the first time")
    func consentPerGroup() async throws {
        try await AuthorizeTests.with { f, send in
            let sub = f.simulator.createUser(realUserStatus: 2)
            f.simulator.setFaults { $0.autoConsent = sub }
            let first = try f.simulator.nativeAuthorization(sub: sub, clientID: TokenFixture.app, nonce: nil)
            #expect(Self.claims(first.identityToken)["real_user_status"] as? Int == 2, "the first authorization")
            let again = try f.simulator.nativeAuthorization(sub: sub, clientID: TokenFixture.app, nonce: nil)
            #expect(Self.claims(again.identityToken)["real_user_status"] == nil, "only on the first sign-in")
            let web = try await send(AuthorizeTests.authorize("response_type=code%20id_token&scope=name%20email&response_mode=form_post"))
            #expect(web.status == 200 && Self.formField("code", in: web.body) != nil)
            #expect(Self.formField("user", in: web.body) == nil, "the group was authorized natively: no user JSON on the web")
        }
    }

    @Test("the email claims only when the email scope was granted at the first authorization")
    func emailScope() async throws {
        try await AuthorizeTests.with { f, send in
            let sub = f.simulator.createUser(email: "jane@example.org", privateEmail: false)
            f.simulator.setFaults { $0.autoConsent = sub }
            let nameOnly = try await send(AuthorizeTests.authorize("response_type=code%20id_token&scope=name&response_mode=form_post"))
            let token = try #require(Self.formField("id_token", in: nameOnly.body))
            #expect(Self.claims(token)["email"] == nil && Self.claims(token)["email_verified"] == nil)
            let later = try await send(AuthorizeTests.authorize("response_type=code%20id_token&scope=name%20email&response_mode=form_post"))
            #expect(Self.claims(try #require(Self.formField("id_token", in: later.body)))["email"] == nil, "scopes are granted once, at the first consent")
            f.simulator.revokeConsent(sub: sub)
            let regranted = try await send(AuthorizeTests.authorize("response_type=code%20id_token&scope=email&response_mode=form_post"))
            #expect(Self.claims(try #require(Self.formField("id_token", in: regranted.body)))["email"] as? String == "jane@example.org")
        }
    }

    @Test("is_private_email only for a relay address, as Apple's tokens: absent for a shared one unless statesSharedEmail")
    func privateEmailClaim() async throws {
        try await AuthorizeTests.with { f, send in
            let shared = f.simulator.createUser(email: "jane@example.org", privateEmail: false)
            f.simulator.setFaults { $0.autoConsent = shared }
            let query = "response_type=code%20id_token&scope=name%20email&response_mode=form_post"
            let sharedClaims = Self.claims(try #require(Self.formField("id_token", in: try await send(AuthorizeTests.authorize(query)).body)))
            #expect(sharedClaims["email"] as? String == "jane@example.org")
            #expect(sharedClaims.keys.contains("is_private_email") == false)
            f.simulator.setFaults { $0.statesSharedEmail = true }
            let stated = Self.claims(try #require(Self.formField("id_token", in: try await send(AuthorizeTests.authorize(query)).body)))
            #expect(stated["is_private_email"] as? String == "false" || stated["is_private_email"] as? Bool == false)
            let relay = f.simulator.createUser(privateEmail: true)
            f.simulator.setFaults { $0.autoConsent = relay; $0.statesSharedEmail = false }
            let relayClaims = Self.claims(try #require(Self.formField("id_token", in: try await send(AuthorizeTests.authorize(query)).body)))
            #expect(relayClaims["is_private_email"] as? String == "true" || relayClaims["is_private_email"] as? Bool == true)
        }
    }

    @Test("c_hash and at_hash are the halves of SHA-256 of the code and the access token")
    func hashes() async throws {
        try await AuthorizeTests.with { f, send in
            f.simulator.setFaults { $0.autoConsent = "" }
            let answer = try await send(AuthorizeTests.authorize("response_type=code%20id_token&scope=name&response_mode=form_post"))
            let code = try #require(Self.formField("code", in: answer.body))
            let front = Self.claims(try #require(Self.formField("id_token", in: answer.body)))
            func half(_ s: String) -> String { CompactJWS.encodeBase64URL(Data(Array(SHA256.hash(data: Data(s.utf8))).prefix(16))) }
            #expect(front["c_hash"] as? String == half(code))
            guard case .success(let tokens) = await f.tokens.exchange(code: code, clientID: TokenFixture.web, redirectURI: TokenFixture.returnURL) else {
                Issue.record("exchange failed"); return
            }
            #expect(Self.claims(try #require(tokens.idToken))["at_hash"] as? String == half(tokens.accessToken))
        }
    }

    @Test("a wrong redirect_uri at the exchange burns the code")
    func redirectMismatchBurns() async throws {
        try await AuthorizeTests.with { f, send in
            let answer = try await send(AuthorizeTests.authorize("response_type=code"))
            let code = try #require(answer.location.flatMap { URLComponents(string: $0)?.queryItems?.first { $0.name == "code" }?.value })
            #expect(await f.tokens.exchange(code: code, clientID: TokenFixture.web, redirectURI: "https://evil.example/cb") == .grantRevoked(error: "invalid_grant"))
            #expect(await f.tokens.exchange(code: code, clientID: TokenFixture.web, redirectURI: TokenFixture.returnURL) == .grantRevoked(error: "invalid_grant"),
                    "used up by the failed attempt")
        }
    }

    @Test("return URLs: https to a domain name only, as Apple; loopback (http or https) only when the team allows it", arguments: [
        ("https://app.example.com/cb", false, true), ("https://app.example.com:8443/cb?x=1", false, true),
        ("http://localhost:8080/cb", false, false), ("http://localhost:8080/cb", true, true),
        ("http://127.0.0.1/cb", true, true), ("http://[::1]:9/cb", true, true), ("http://app.example.com/cb", true, false),
        ("http://localhost.evil.com/cb", true, false),
        // Apple: no IP address, no localhost, even over https (apple-sign-in.md §1.1, §11.7).
        ("https://203.0.113.7/cb", false, false), ("https://127.0.0.1/cb", false, false), ("https://[::1]/cb", false, false),
        ("https://[2001:db8::1]:8443/cb", false, false), ("https://localhost/cb", false, false), ("https://LocalHost:8443/cb", false, false),
        ("https://app.localhost/cb", false, false), ("https://localhost./cb", false, false),
        ("https://127.0.0.1/cb", true, true), ("https://localhost:8443/cb", true, true), ("https://203.0.113.7/cb", true, false),
        // Nor a fragment, nor credentials.
        ("https://app.example.com/cb#x", false, false), ("https://user@app.example.com/cb", false, false),
        ("https://localhost.evil.com/cb", false, true), ("https://127.0.0.1.nip.io/cb", false, true),
    ] as [(String, Bool, Bool)])
    func returnURLs(url: String, loopback: Bool, accepted: Bool) {
        let team = SimulatedAppleID.Team(teamID: "T", keys: [:], clients: ["c": [url]], allowsLoopbackHTTP: loopback)
        #expect(team.acceptsReturnURL(url) == accepted, "\(url)")
    }

    @Test("/auth/revoke ends the user's whole authorization: sibling tokens die; the user JSON comes back")
    func revokeEndsAuthorization() async throws {
        try await AuthorizeTests.with { f, send in
            let sub = f.simulator.createUser()
            f.simulator.setFaults { $0.autoConsent = sub }
            var tokens: [String] = []
            for _ in 0..<2 {
                let answer = try await send(AuthorizeTests.authorize("response_type=code&scope=name&response_mode=form_post"))
                let code = try #require(Self.formField("code", in: answer.body))
                guard case .success(let t) = await f.tokens.exchange(code: code, clientID: TokenFixture.web, redirectURI: TokenFixture.returnURL),
                      let refresh = t.refreshToken else { Issue.record("exchange failed"); return }
                tokens.append(refresh)
            }
            #expect(await f.tokens.revoke(token: tokens[0], isRefreshToken: true, clientID: TokenFixture.web) == .revoked)
            #expect(await f.tokens.refresh(token: tokens[1], clientID: TokenFixture.web) == .grantRevoked(error: "invalid_grant"), "a sibling dies too")
            let next = try await send(AuthorizeTests.authorize("response_type=code&scope=name&response_mode=form_post"))
            #expect(Self.formField("user", in: next.body) != nil, "a first authorization again")
        }
    }

    @Test("the control API's revoke-consent and delete-account notify the relying party")
    func controlNotifies() async throws {
        let receiver = try await NotificationReceiver(statuses: [])
        let team = TeamFixture()
        try await withTeardown(SimulatedAppleID.start(
            team: .init(teamID: team.teamID, keys: [team.keyID: team.key.publicKey], clients: [TokenFixture.web: [TokenFixture.returnURL], TokenFixture.app: []]),
            notificationURL: receiver.url), stop: { await $0.stop() }) { simulator in
            try await withTeardown(HTTPClient(eventLoopGroupProvider: .shared(MultiThreadedEventLoopGroup.singleton)), stop: { try? await $0.shutdown() }) { client in
                for (index, action) in ["revoke-consent", "delete-account"].enumerated() {
                    let sub = simulator.createUser()
                    var request = HTTPClientRequest(url: simulator.baseURL + "/sim/users/\(sub)/\(action)")
                    request.method = .POST
                    let response = try await client.execute(request, timeout: .seconds(5))
                    #expect(response.status == .ok)
                    await receiver.waitForBodies(index + 1)
                    let body = try #require(receiver.bodies.withLockedValue { $0.last })
                    let payload = try #require((try JSONSerialization.jsonObject(with: Data(body)) as? [String: Any])?["payload"] as? String)
                    let events = Self.claims(payload)["events"] as? String ?? ""
                    #expect(events.contains(action == "revoke-consent" ? "consent-revoked" : "account-delete") && events.contains(sub), "\(events)")
                }
            }
        }
    }
}

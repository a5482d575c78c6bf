import Foundation
import AsyncHTTPClient
import Crypto
import Logging
import NIOCore
import NIOPosix
import Testing

@testable import AppleID
@testable import AppleIDSimulator

/// The relying party's token client against the simulator, over real HTTP, on one clock.
struct TokenFixture {
    static let web = "com.example.web"
    static let app = "com.example.app"
    static let returnURL = "https://app.example.com/_auth/callback"
    let team: TeamFixture
    let simulator: SimulatedAppleID
    let client: HTTPClient
    let tokens: AppleTokenClient
    let keySet: AppleKeySet

    static func with(_ body: (TokenFixture) async throws -> Void) async throws {
        let team = TeamFixture()
        let clock = team.clock
        let simulator = try await SimulatedAppleID.start(
            team: .init(teamID: team.teamID, keys: [team.keyID: team.key.publicKey], clients: [web: [returnURL], app: []]),
            clock: { clock.now })
        let client = HTTPClient(eventLoopGroupProvider: .shared(MultiThreadedEventLoopGroup.singleton))
        let logger = Logger(label: "test")
        let fixture = TokenFixture(
            team: team, simulator: simulator, client: client,
            tokens: AppleTokenClient(baseURL: simulator.baseURL, httpClient: client, secrets: try team.minter(), logger: logger),
            keySet: AppleKeySet(baseURL: simulator.baseURL, httpClient: client, logger: logger))
        var failure: (any Error)? = nil
        do { try await body(fixture) } catch { failure = error }
        try? await client.shutdown()
        await simulator.stop()
        if let failure { throw failure }
    }

    var clock: TestClock { team.clock }

    func webCode(nonce: String? = "n-1") -> (sub: String, code: String) {
        let sub = simulator.createUser()
        return (sub, simulator.issueCode(sub: sub, clientID: Self.web, redirectURI: Self.returnURL, nonce: nonce))
    }

    func refreshToken() async throws -> String {
        let (_, code) = webCode()
        guard case .success(let tokens) = await self.tokens.exchange(code: code, clientID: Self.web, redirectURI: Self.returnURL),
              let refresh = tokens.refreshToken else { throw TestFailure.noRefreshToken }
        return refresh
    }

    enum TestFailure: Error { case noRefreshToken }
}

@Suite("Token client against the simulator (real HTTP)", .serialized)
struct AppleTokenClientTests {
    @Test("web code exchange: tokens, and an identity token the verifier accepts with the login's nonce")
    func webExchange() async throws {
        try await TokenFixture.with { f in
            let (sub, code) = f.webCode(nonce: "nonce-42")
            guard case .success(let tokens) = await f.tokens.exchange(code: code, clientID: TokenFixture.web, redirectURI: TokenFixture.returnURL) else {
                Issue.record("exchange failed"); return
            }
            #expect(tokens.refreshToken?.hasPrefix("r") == true)
            #expect(tokens.expiresIn == 3600)
            let clock = f.clock
            let verifier = IdentityTokenVerifier(keySet: f.keySet, clientIDs: [TokenFixture.web, TokenFixture.app], now: { clock.now })
            let identity = try await verifier.verify(try #require(tokens.idToken), expectedNonce: "nonce-42")
            #expect(identity.subject == sub)
            #expect(identity.audience == TokenFixture.web)
        }
    }

    @Test("native code exchange has no redirect_uri; sending one is a mismatch")
    func nativeExchange() async throws {
        try await TokenFixture.with { f in
            let sub = f.simulator.createUser()
            let code = f.simulator.issueCode(sub: sub, clientID: TokenFixture.app, redirectURI: nil, nonce: nil)
            let other = f.simulator.issueCode(sub: sub, clientID: TokenFixture.app, redirectURI: nil, nonce: nil)
            guard case .success = await f.tokens.exchange(code: code, clientID: TokenFixture.app, redirectURI: nil) else { Issue.record("native exchange failed"); return }
            #expect(await f.tokens.exchange(code: other, clientID: TokenFixture.app, redirectURI: TokenFixture.returnURL) == .grantRevoked(error: "invalid_grant"))
        }
    }

    @Test("a code is single use, lives five minutes, and belongs to its client")
    func codeRules() async throws {
        try await TokenFixture.with { f in
            let (_, code) = f.webCode()
            guard case .success = await f.tokens.exchange(code: code, clientID: TokenFixture.web, redirectURI: TokenFixture.returnURL) else { Issue.record("first use failed"); return }
            #expect(await f.tokens.exchange(code: code, clientID: TokenFixture.web, redirectURI: TokenFixture.returnURL) == .grantRevoked(error: "invalid_grant"))
            let (_, late) = f.webCode()
            f.clock.advance(300)
            #expect(await f.tokens.exchange(code: late, clientID: TokenFixture.web, redirectURI: TokenFixture.returnURL) == .grantRevoked(error: "invalid_grant"))
            let (_, foreign) = f.webCode()
            #expect(await f.tokens.exchange(code: foreign, clientID: TokenFixture.app, redirectURI: TokenFixture.returnURL) == .grantRevoked(error: "invalid_grant"))
        }
    }

    @Test("refresh: success with and without an id_token; revoked consent is grant revoked")
    func refresh() async throws {
        try await TokenFixture.with { f in
            let refresh = try await f.refreshToken()
            guard case .success(let first) = await f.tokens.refresh(token: refresh, clientID: TokenFixture.web) else { Issue.record("refresh failed"); return }
            #expect(first.idToken != nil)
            #expect(first.refreshToken == nil, "a refresh answers without a new refresh token")
            f.simulator.setFaults { $0.refreshReturnsIDToken = false }
            guard case .success(let second) = await f.tokens.refresh(token: refresh, clientID: TokenFixture.web) else { Issue.record("refresh failed"); return }
            #expect(second.idToken == nil)
            let sub = f.simulator.grants.withLockedValue { $0.refreshTokens[refresh]!.sub }
            f.simulator.revokeConsent(sub: sub)
            #expect(await f.tokens.refresh(token: refresh, clientID: TokenFixture.web) == .grantRevoked(error: "invalid_grant"))
        }
    }

    @Test("a throttled refresh (429) is told apart from an outage, never a revocation")
    func throttled() async throws {
        try await TokenFixture.with { f in
            let refresh = try await f.refreshToken()
            f.simulator.setFaults { $0.throttleInterval = 86_400 }
            #expect(await f.tokens.refresh(token: refresh, clientID: TokenFixture.web) == .throttled(retryAfter: nil))
            f.simulator.setFaults { $0.retryAfter = 7200 }
            #expect(await f.tokens.refresh(token: refresh, clientID: TokenFixture.web) == .throttled(retryAfter: 7200),
                    "Apple's Retry-After is carried to the caller")
        }
    }

    @Test("Retry-After: delta-seconds or an HTTP-date, bounded to a week; junk is no advice", arguments: [
        ("120", 120), (" 30 ", 30), ("0", nil), ("-5", nil), ("+5", nil), ("1e3", nil), ("soon", nil), ("", nil),
        ("99999999", 7 * 86_400),
        ("Wed, 25 Nov 2026 18:00:00 GMT", 3600), ("Wed, 25 Nov 2026 16:00:00 GMT", nil), ("Wed, 25 Nov 2026 18:00:00 PST", nil),
    ] as [(String, Int?)])
    func retryAfter(value: String, seconds: Int?) {
        let now = Date(timeIntervalSince1970: 1_795_626_000)  // Wed, 25 Nov 2026 17:00:00 GMT
        #expect(AppleTokenClient.retryAfterSeconds(value, now: now) == seconds, "\(value)")
    }

    @Test("a wrong key or an unknown client id is our misconfiguration, not the user's revocation")
    func misconfigured() async throws {
        try await TokenFixture.with { f in
            let wrongKey = try ClientSecretMinter(teamID: f.team.teamID, keyID: f.team.keyID, privateKeyPEM: P256.Signing.PrivateKey().pemRepresentation)
            let badClient = AppleTokenClient(baseURL: f.simulator.baseURL, httpClient: f.client, secrets: wrongKey, logger: Logger(label: "test"))
            let refresh = try await f.refreshToken()
            #expect(await badClient.refresh(token: refresh, clientID: TokenFixture.web) == .clientMisconfigured(error: "invalid_client"))
            #expect(await f.tokens.refresh(token: refresh, clientID: "com.unknown") == .clientMisconfigured(error: "invalid_client"))
        }
    }

    @Test("Apple unreachable: transient")
    func unreachable() async throws {
        let team = TeamFixture()
        let client = HTTPClient(eventLoopGroupProvider: .shared(MultiThreadedEventLoopGroup.singleton))
        let tokens = AppleTokenClient(baseURL: "http://127.0.0.1:1", httpClient: client, secrets: try team.minter(), timeout: .milliseconds(300), logger: Logger(label: "t"))
        guard case .transient = await tokens.refresh(token: "r", clientID: "c") else { Issue.record("not transient"); return }
        try await client.shutdown()
    }

    @Test("revoke: the refresh token dies at Apple; unknown tokens are answered 200 too")
    func revoke() async throws {
        try await TokenFixture.with { f in
            let refresh = try await f.refreshToken()
            #expect(await f.tokens.revoke(token: refresh, isRefreshToken: true, clientID: TokenFixture.web) == .revoked)
            #expect(!f.simulator.isRefreshTokenValid(refresh))
            #expect(await f.tokens.refresh(token: refresh, clientID: TokenFixture.web) == .grantRevoked(error: "invalid_grant"))
            #expect(await f.tokens.revoke(token: "r-unknown", isRefreshToken: true, clientID: TokenFixture.web) == .revoked)
        }
    }

    @Test("every answer is classified once", arguments: [
        ("200 with tokens", 200, #"{"access_token":"a","token_type":"Bearer","expires_in":3600}"#, false, "success"),
        ("200 not JSON", 200, "<html>", false, "transient"),
        ("invalid_grant", 400, #"{"error":"invalid_grant"}"#, false, "grantRevoked"),
        ("invalid_request on refresh", 400, #"{"error":"invalid_request"}"#, true, "grantRevoked"),
        ("invalid_request on exchange", 400, #"{"error":"invalid_request"}"#, false, "clientMisconfigured"),
        ("invalid_client", 400, #"{"error":"invalid_client","error_description":"x"}"#, true, "clientMisconfigured"),
        ("unauthorized_client", 400, #"{"error":"unauthorized_client"}"#, true, "clientMisconfigured"),
        ("unsupported_grant_type", 400, #"{"error":"unsupported_grant_type"}"#, true, "clientMisconfigured"),
        ("429", 429, "", true, "throttled"),
        ("429 on a code exchange", 429, #"{"error":"invalid_grant"}"#, false, "throttled"),
        ("503", 503, #"{"error":"invalid_grant"}"#, true, "transient"),
        ("400 without JSON", 400, "bad", true, "transient"),
        ("404", 404, #"{"error":"not_found"}"#, true, "transient"),
    ] as [(String, Int, String, Bool, String)])
    func classification(name: String, status: Int, body: String, isRefresh: Bool, expected: String) {
        let outcome = AppleTokenClient.classify(status: status, body: Array(body.utf8), isRefresh: isRefresh)
        let kind: String
        switch outcome {
        case .success: kind = "success"
        case .grantRevoked: kind = "grantRevoked"
        case .clientMisconfigured: kind = "clientMisconfigured"
        case .transient: kind = "transient"
        case .throttled: kind = "throttled"
        }
        #expect(kind == expected, "\(name)")
    }

    @Test("form bodies escape everything but unreserved characters")
    func formEncoding() {
        #expect(FormEncoding.encode([("a b", "x+y&z=1/é~._-")]) == "a%20b=x%2By%26z%3D1%2F%C3%A9~._-")
    }
}

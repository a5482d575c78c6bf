import AsyncHTTPClient
import Crypto
import Foundation
import Logging
import NIOPosix
import Testing
import _CryptoExtras

@testable import AppleID
@testable import AppleIDSimulator

/// A simulator, a key set reading it over HTTP, and a fixed clock.
struct VerifierFixture {
    static let now: Int64 = 1_795_000_000
    static let clientIDs = ["com.example.web", "com.example.app"]
    let simulator: SimulatedAppleID
    let client: HTTPClient
    let keySet: AppleKeySet

    static func with(_ body: (VerifierFixture) async throws -> Void) async throws {
        // The simulator and the key fetch on a loop of their own, with the key set's default
        // timeout (5 s): on the process's shared loops, beside the 1 GiB streaming test's app,
        // the fetches ran past 5 s in full runs (the timeout was 30 s for a while for that).
        let loops = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let team = SimulatedAppleID.Team(teamID: "DEF123GHIJ", keys: [:])
        var failure: (any Error)? = nil
        do {
            let simulator = try await SimulatedAppleID.start(team: team, group: loops)
            let client = HTTPClient(eventLoopGroupProvider: .shared(loops))
            let fixture = VerifierFixture(simulator: simulator, client: client,
                                          keySet: AppleKeySet(baseURL: simulator.baseURL, httpClient: client, logger: Logger(label: "test")))
            do { try await body(fixture) } catch { failure = error }
            try? await client.shutdown()
            await simulator.stop()
        } catch { failure = error }
        try? await loops.shutdownGracefully()
        if let failure { throw failure }
    }

    var identityVerifier: IdentityTokenVerifier { IdentityTokenVerifier(keySet: keySet, clientIDs: Self.clientIDs, now: { Self.now }) }
    var notificationVerifier: NotificationVerifier { NotificationVerifier(keySet: keySet, clientIDs: Self.clientIDs, now: { Self.now }) }

    /// Valid identity-token claims, with overrides (`nil` removes a claim).
    static func claims(_ overrides: [String: Any?] = [:]) -> [String: Any] {
        var claims: [String: Any] = [
            "iss": "https://appleid.apple.com", "aud": "com.example.web", "iat": now - 10, "exp": now + 600,
            "sub": "001437.def535ddd9e24c4fa4367dca50fdfedb.1951", "email": "x7c9q2m4tz@privaterelay.appleid.com",
            "email_verified": "true", "is_private_email": "true", "nonce": "n-123", "nonce_supported": true, "auth_time": now - 20,
        ]
        for (key, value) in overrides { claims[key] = value }
        return claims
    }

    func sign(_ claims: [String: Any]) throws -> String { try simulator.signingKeys.sign(claims) }
}

@Suite("Identity-token verifier", .serialized)
struct IdentityTokenTests {
    @Test("a valid web token, string booleans")
    func validWeb() async throws {
        try await VerifierFixture.with { f in
            let identity = try await f.identityVerifier.verify(try f.sign(VerifierFixture.claims()), expectedNonce: "n-123")
            #expect(identity.subject == "001437.def535ddd9e24c4fa4367dca50fdfedb.1951")
            #expect(identity.audience == "com.example.web")
            #expect(identity.email == "x7c9q2m4tz@privaterelay.appleid.com")
            #expect(identity.emailVerified == true)
            #expect(identity.isPrivateEmail == true)
            #expect(identity.realUserStatus == nil)
        }
    }

    @Test("without is_private_email (Apple omits it for a shared address) a real email is not private, a relay address is, no email is unknown", arguments: [
        ("jane@example.org" as String?, false as Bool?), ("x7c9q2m4tz@PrivateRelay.AppleID.com", true), (nil, nil),
    ])
    func privateEmailAbsent(email: String?, expected: Bool?) async throws {
        try await VerifierFixture.with { f in
            let token = try f.sign(VerifierFixture.claims(["is_private_email": nil, "email": email]))
            let identity = try await f.identityVerifier.verify(token, expectedNonce: "n-123")
            #expect(identity.email == email)
            #expect(identity.isPrivateEmail == expected)
        }
    }

    @Test("a valid native token: JSON booleans, real_user_status, transfer_sub, aud as a list, no nonce sent")
    func validNative() async throws {
        try await VerifierFixture.with { f in
            let token = try f.sign(VerifierFixture.claims([
                "aud": ["other.app", "com.example.app"], "email_verified": true, "is_private_email": false,
                "real_user_status": 2, "transfer_sub": "760417.ebbf12acbc78e1be1668ba852d492d8a.1827", "nonce": nil,
            ]))
            let identity = try await f.identityVerifier.verify(token, expectedNonce: nil)
            #expect(identity.audience == "com.example.app")
            #expect(identity.emailVerified == true)
            #expect(identity.isPrivateEmail == false)
            #expect(identity.realUserStatus == 2)
            #expect(identity.transferSubject == "760417.ebbf12acbc78e1be1668ba852d492d8a.1827")
        }
    }

    @Test("a missing nonce is accepted only when the platform says nonce_supported: false")
    func nonceSupportedFalse() async throws {
        try await VerifierFixture.with { f in
            let token = try f.sign(VerifierFixture.claims(["nonce": nil, "nonce_supported": "false"]))
            let identity = try await f.identityVerifier.verify(token, expectedNonce: "n-123")
            #expect(identity.subject == "001437.def535ddd9e24c4fa4367dca50fdfedb.1951")
            #expect(identity.audience == "com.example.web")
            #expect(identity.email == "x7c9q2m4tz@privaterelay.appleid.com")
            #expect(identity.nonce == nil, "no nonce in the token")
            #expect(identity.nonceSupported == false, "the string \"false\" read as the platform's word")
        }
    }

    @Test("within the leeway: just expired or issued a little ahead")
    func leeway() async throws {
        try await VerifierFixture.with { f in
            let expired = try await f.identityVerifier.verify(try f.sign(VerifierFixture.claims(["exp": VerifierFixture.now - 2])), expectedNonce: "n-123")
            #expect(expired.subject == "001437.def535ddd9e24c4fa4367dca50fdfedb.1951")
            #expect(expired.audience == "com.example.web")
            #expect(expired.expiresAt == VerifierFixture.now - 2, "two seconds past exp, within the leeway")
            let ahead = try await f.identityVerifier.verify(try f.sign(VerifierFixture.claims(["iat": VerifierFixture.now + 3])), expectedNonce: "n-123")
            #expect(ahead.subject == "001437.def535ddd9e24c4fa4367dca50fdfedb.1951")
            #expect(ahead.audience == "com.example.web")
            #expect(ahead.issuedAt == VerifierFixture.now + 3, "issued three seconds ahead, within the leeway")
        }
    }

    @Test("real_user_status: 0–2 kept; anything else is unknown (no header), never a refused sign-in", arguments: [
        (0, 0), (1, 1), (2, 2), (7, nil), (-1, nil), ("2", nil), ("likely", nil), (true, nil),
    ] as [(any Sendable, Int?)])
    func realUserStatus(value: any Sendable, expected: Int?) async throws {
        try await VerifierFixture.with { f in
            let identity = try await f.identityVerifier.verify(try f.sign(VerifierFixture.claims(["real_user_status": value])), expectedNonce: "n-123")
            #expect(identity.realUserStatus == expected, "\(value)")
        }
    }

    @Test("c_hash: the front-channel token must name the code delivered beside it")
    func codeHash() async throws {
        try await VerifierFixture.with { f in
            let code = "c1234.0.abcd.efgh"
            let hash = SimulatedAppleID.halfHash(code)
            let good = try f.sign(VerifierFixture.claims(["c_hash": hash]))
            _ = try await f.identityVerifier.verify(good, expectedNonce: "n-123", code: code)
            _ = try await f.identityVerifier.verify(good, expectedNonce: "n-123")  // no code beside it (native, token endpoint): not checked
            await #expect(throws: AppleTokenRejection.codeHash) { try await f.identityVerifier.verify(good, expectedNonce: "n-123", code: code + "x") }
            let without = try f.sign(VerifierFixture.claims())
            await #expect(throws: AppleTokenRejection.codeHash) { try await f.identityVerifier.verify(without, expectedNonce: "n-123", code: code) }
        }
    }

    @Test("the configured leeway (apple.clock_skew) bounds iat and exp")
    func configuredLeeway() async throws {
        try await VerifierFixture.with { f in
            let verifier = IdentityTokenVerifier(keySet: f.keySet, clientIDs: VerifierFixture.clientIDs, leeway: 60, now: { VerifierFixture.now })
            _ = try await verifier.verify(try f.sign(VerifierFixture.claims(["exp": VerifierFixture.now - 59])), expectedNonce: "n-123")
            _ = try await verifier.verify(try f.sign(VerifierFixture.claims(["iat": VerifierFixture.now + 60])), expectedNonce: "n-123")
            await #expect(throws: AppleTokenRejection.expired) {
                try await verifier.verify(try f.sign(VerifierFixture.claims(["exp": VerifierFixture.now - 60])), expectedNonce: "n-123")
            }
            await #expect(throws: AppleTokenRejection.issuedInFuture) {
                try await verifier.verify(try f.sign(VerifierFixture.claims(["iat": VerifierFixture.now + 61])), expectedNonce: "n-123")
            }
        }
    }

    struct Forgery: CustomTestStringConvertible, Sendable {
        let name: String
        let expected: AppleTokenRejection
        let nonce: String?
        let make: @Sendable (VerifierFixture) throws -> String
        var testDescription: String { name }
        init(_ name: String, _ expected: AppleTokenRejection, nonce: String? = "n-123", _ make: @escaping @Sendable (VerifierFixture) throws -> String) {
            self.name = name
            self.expected = expected
            self.nonce = nonce
            self.make = make
        }
    }

    static let forgeries: [Forgery] = [
        Forgery("not a JWS", .malformed) { _ in "not.a.jws" },
        Forgery("alg none, no signature", .algorithm) { f in
            CompactJWS.make(header: ["alg": "none", "kid": f.simulator.publishedKeyIDs[0]], claims: VerifierFixture.claims()) { _ in Data() }
        },
        Forgery("HS256 signed with Apple's public key as the secret", .algorithm) { f in
            let kid = f.simulator.publishedKeyIDs[0]
            let publicKey = try f.simulator.signingKeys.jwks()
            let secret = SymmetricKey(data: try JSONSerialization.data(withJSONObject: publicKey))
            return CompactJWS.make(header: ["alg": "HS256", "kid": kid], claims: VerifierFixture.claims()) { input in
                Data(HMAC<SHA256>.authenticationCode(for: input, using: secret))
            }
        },
        Forgery("unknown kid, signed by the attacker's key", .unknownKey) { _ in
            let attacker = try _RSA.Signing.PrivateKey(keySize: .bits2048)
            return try CompactJWS.make(header: ["alg": "RS256", "kid": "attacker01"], claims: VerifierFixture.claims()) { input in
                try attacker.signature(for: input, padding: .insecurePKCS1v1_5).rawRepresentation
            }
        },
        Forgery("embedded jwk in the header", .embeddedKey) { f in
            CompactJWS.make(header: ["alg": "RS256", "kid": f.simulator.publishedKeyIDs[0], "jwk": ["kty": "RSA", "n": "AQAB", "e": "AQAB"]], claims: VerifierFixture.claims()) { _ in Data([1, 2, 3]) }
        },
        Forgery("wrong iss", .issuer) { f in try f.sign(VerifierFixture.claims(["iss": "https://appleid.apple.com.evil"])) },
        Forgery("wrong aud", .audience) { f in try f.sign(VerifierFixture.claims(["aud": "com.other.app"])) },
        Forgery("no aud", .audience) { f in try f.sign(VerifierFixture.claims(["aud": nil])) },
        Forgery("expired", .expired) { f in try f.sign(VerifierFixture.claims(["exp": VerifierFixture.now - 6])) },
        Forgery("iat in the future", .issuedInFuture) { f in try f.sign(VerifierFixture.claims(["iat": VerifierFixture.now + 60])) },
        Forgery("no exp", .missingClaim) { f in try f.sign(VerifierFixture.claims(["exp": nil])) },
        Forgery("exp as a string", .missingClaim) { f in try f.sign(VerifierFixture.claims(["exp": "\(VerifierFixture.now + 600)"])) },
        Forgery("no sub", .missingClaim) { f in try f.sign(VerifierFixture.claims(["sub": nil])) },
        Forgery("nonce missing, nonce_supported true", .nonceMissing) { f in try f.sign(VerifierFixture.claims(["nonce": nil])) },
        Forgery("nonce missing, nonce_supported absent", .nonceMissing) { f in try f.sign(VerifierFixture.claims(["nonce": nil, "nonce_supported": nil])) },
        Forgery("nonce wrong", .nonceMismatch) { f in try f.sign(VerifierFixture.claims(["nonce": "n-124"])) },
        Forgery("tampered payload", .signature) { f in
            let good = try f.sign(VerifierFixture.claims()).split(separator: ".")
            let evil = CompactJWS.encodeBase64URL(try JSONSerialization.data(withJSONObject: VerifierFixture.claims(["sub": "victim"])))
            return "\(good[0]).\(evil).\(good[2])"
        },
        Forgery("boolean claim \"yes\"", .claimType) { f in try f.sign(VerifierFixture.claims(["email_verified": "yes"])) },
        Forgery("boolean claim as the number 1", .claimType) { f in try f.sign(VerifierFixture.claims(["email_verified": 1])) },
    ]

    @Test("forged or invalid tokens are rejected with their reason", arguments: forgeries)
    func forged(_ forgery: Forgery) async throws {
        try await VerifierFixture.with { f in
            let token = try forgery.make(f)
            await #expect(throws: forgery.expected) { try await f.identityVerifier.verify(token, expectedNonce: forgery.nonce) }
        }
    }

    @Test("Apple's keys unreachable and never fetched: a transient rejection, not 'invalid'")
    func keysUnavailable() async throws {
        let client = HTTPClient(eventLoopGroupProvider: .shared(MultiThreadedEventLoopGroup.singleton))
        let keySet = AppleKeySet(baseURL: "http://127.0.0.1:1", httpClient: client, timeout: .milliseconds(300), logger: Logger(label: "test"))
        let verifier = IdentityTokenVerifier(keySet: keySet, clientIDs: VerifierFixture.clientIDs, now: { VerifierFixture.now })
        let token = CompactJWS.make(header: ["alg": "RS256", "kid": "k"], claims: VerifierFixture.claims()) { _ in Data([1]) }
        do {
            _ = try await verifier.verify(token, expectedNonce: nil)
            Issue.record("accepted")
        } catch {
            #expect(error == .keysUnavailable)
            #expect(error.isTransient)
        }
        try await client.shutdown()
    }
}

@Suite("Notification verifier", .serialized)
struct NotificationVerifierTests {
    static func body(_ payload: String) -> [UInt8] { Array(#"{"payload":"\#(payload)"}"#.utf8) }

    static func claims(events: Any, overrides: [String: Any?] = [:]) -> [String: Any] {
        var claims: [String: Any] = [
            "iss": "https://appleid.apple.com", "aud": "com.example.app", "iat": VerifierFixture.now - 5,
            "exp": VerifierFixture.now + 86_400, "jti": "yctpp1ZHaGCzaNB9PWB4DA", "events": events,
        ]
        for (key, value) in overrides { claims[key] = value }
        return claims
    }

    @Test("events as a JSON string (as Apple sends it), milliseconds normalized to seconds")
    func eventsAsString() async throws {
        try await VerifierFixture.with { f in
            let events = #"{"type":"consent-revoked","sub":"001437.abc.1951","event_time":1735689599123}"#
            let n = try await f.notificationVerifier.verify(body: Self.body(try f.sign(Self.claims(events: events))))
            #expect(n == AppleNotification(jti: "yctpp1ZHaGCzaNB9PWB4DA", audience: "com.example.app", kind: .consentRevoked,
                                           subject: "001437.abc.1951", email: nil, isPrivateEmail: nil, eventTime: 1_735_689_599))
        }
    }

    @Test("events as an object (as Apple documents it), seconds kept, email fields, no exp")
    func eventsAsObject() async throws {
        try await VerifierFixture.with { f in
            let events: [String: Any] = ["type": "email-disabled", "sub": "s1", "email": "r@privaterelay.appleid.com", "is_private_email": "true", "event_time": 1_508_184_845]
            let n = try await f.notificationVerifier.verify(body: Self.body(try f.sign(Self.claims(events: events, overrides: ["exp": nil]))))
            #expect(n.kind == .emailDisabled)
            #expect(n.email == "r@privaterelay.appleid.com")
            #expect(n.isPrivateEmail == true)
            #expect(n.eventTime == 1_508_184_845)
        }
    }

    @Test("an email event without is_private_email: private by the address")
    func notificationPrivateEmailAbsent() async throws {
        try await VerifierFixture.with { f in
            let relay = #"{"type":"email-enabled","sub":"s1","email":"r@privaterelay.appleid.com","event_time":1735689599}"#
            let relayed = try await f.notificationVerifier.verify(body: Self.body(try f.sign(Self.claims(events: relay))))
            #expect(relayed.isPrivateEmail == true)
            let shared = #"{"type":"email-enabled","sub":"s1","email":"jane@example.org","event_time":1735689599}"#
            let sharedNotice = try await f.notificationVerifier.verify(body: Self.body(try f.sign(Self.claims(events: shared))))
            #expect(sharedNotice.isPrivateEmail == false)
        }
    }

    @Test("a notification just inside the age bound is accepted, without exp")
    func freshEnough() async throws {
        try await VerifierFixture.with { f in
            let events = #"{"type":"consent-revoked","sub":"s1"}"#
            let body = Self.body(try f.sign(Self.claims(events: events, overrides: ["exp": nil, "iat": VerifierFixture.now - NotificationVerifier.maximumAge + 60])))
            #expect(try await f.notificationVerifier.verify(body: body).kind == .consentRevoked)
        }
    }

    @Test("both spellings of account deletion, and unknown types", arguments: [
        ("account-delete", AppleNotification.Kind.accountDeleted), ("account-deleted", .accountDeleted),
        ("email-enabled", .emailEnabled), ("something-new", .unknown("something-new")),
    ])
    func kinds(type: String, expected: AppleNotification.Kind) async throws {
        try await VerifierFixture.with { f in
            let events = #"{"type":"\#(type)","sub":"s1","is_private_email":true,"event_time":1735689599}"#
            let n = try await f.notificationVerifier.verify(body: Self.body(try f.sign(Self.claims(events: events))))
            #expect(n.kind == expected)
        }
    }

    @Test("unverifiable notifications are rejected", arguments: [
        ("not JSON", AppleTokenRejection.malformed), ("wrong aud", .audience), ("events garbage", .events), ("expired", .expired), ("forged signature", .signature),
        ("30 days old, no exp", .stale), ("25 hours old, exp far ahead", .stale),
    ])
    func rejected(name: String, expected: AppleTokenRejection) async throws {
        try await VerifierFixture.with { f in
            let events = #"{"type":"consent-revoked","sub":"s1"}"#
            let body: [UInt8]
            switch name {
            case "not JSON": body = Array("payload=x".utf8)
            case "wrong aud": body = Self.body(try f.sign(Self.claims(events: events, overrides: ["aud": "com.other"])))
            case "events garbage": body = Self.body(try f.sign(Self.claims(events: "{not json")))
            case "expired": body = Self.body(try f.sign(Self.claims(events: events, overrides: ["exp": VerifierFixture.now - 60])))
            case "30 days old, no exp": body = Self.body(try f.sign(Self.claims(events: events, overrides: ["exp": nil, "iat": VerifierFixture.now - 30 * 86_400])))
            case "25 hours old, exp far ahead":
                body = Self.body(try f.sign(Self.claims(events: events, overrides: ["iat": VerifierFixture.now - 25 * 3600, "exp": VerifierFixture.now + 86_400])))
            default:
                let good = try f.sign(Self.claims(events: events)).split(separator: ".")
                body = Self.body("\(good[0]).\(good[1]).\(CompactJWS.encodeBase64URL(Data(repeating: 7, count: 256)))")
            }
            await #expect(throws: expected) { try await f.notificationVerifier.verify(body: body) }
        }
    }
}

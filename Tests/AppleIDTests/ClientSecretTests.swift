import Crypto
import Foundation
import NIOConcurrencyHelpers
import Testing

@testable import AppleID
@testable import AppleIDSimulator

/// A settable clock in whole seconds.
final class TestClock: Sendable {
    private let value = NIOLockedValueBox<Int64>(1_795_000_000)
    var now: Int64 {
        get { value.withLockedValue { $0 } }
        set { value.withLockedValue { $0 = newValue } }
    }
    func advance(_ seconds: Int64) { value.withLockedValue { $0 += seconds } }
}

struct TeamFixture {
    let key = P256.Signing.PrivateKey()
    var teamID = "DEF123GHIJ"
    let keyID = "ABC123DEFG"
    var clock = TestClock()

    func minter(lifetime: Int64 = 86_400) throws -> ClientSecretMinter {
        let clock = self.clock
        return try ClientSecretMinter(teamID: teamID, keyID: keyID, privateKeyPEM: key.pemRepresentation, lifetime: lifetime, now: { clock.now })
    }

    var validator: ClientSecretValidator { ClientSecretValidator(teamID: teamID, keys: [keyID: key.publicKey]) }

    /// A secret with any header, claims and signing, for forgeries.
    func forge(header: [String: Any]? = nil, claims: [String: Any]? = nil, der: Bool = false, signWith other: P256.Signing.PrivateKey? = nil) -> String {
        let header = header ?? ["alg": "ES256", "kid": keyID]
        let claims = claims ?? ["iss": teamID, "iat": clock.now, "exp": clock.now + 3600, "aud": "https://appleid.apple.com", "sub": "com.example.web"]
        let signer = other ?? key
        return CompactJWS.make(header: header, claims: claims) { input in
            let signature = try! signer.signature(for: input)
            return der ? signature.derRepresentation : signature.rawRepresentation
        }
    }
}

@Suite("Client secret")
struct ClientSecretTests {
    @Test("header, claims and a raw R‖S signature, as Apple requires")
    func structure() throws {
        let team = TeamFixture()
        let secret = try team.minter().secret(for: "com.example.web")
        let jws = try #require(CompactJWS.parse(secret))
        #expect(jws.header as NSDictionary == ["alg": "ES256", "kid": "ABC123DEFG"] as NSDictionary)
        #expect(jws.claims["iss"] as? String == "DEF123GHIJ")
        #expect(jws.claims["aud"] as? String == "https://appleid.apple.com")
        #expect(jws.claims["sub"] as? String == "com.example.web")
        #expect(jws.integerClaim("iat") == team.clock.now - 60, "a minute in the past: Apple's clock may run behind ours")
        #expect(jws.integerClaim("exp") == team.clock.now - 60 + 86_400)
        #expect(!secret.contains("."+"0"+"."), "whole seconds only")
        #expect(jws.signature.count == 64)
        let signature = try P256.Signing.ECDSASignature(rawRepresentation: jws.signature)
        #expect(team.key.publicKey.isValidSignature(signature, for: Data(jws.signingInput.utf8)))
    }

    @Test("cached per client id, minted again once half the lifetime has passed")
    func caching() throws {
        let team = TeamFixture()
        let minter = try team.minter(lifetime: 3600)
        let first = minter.secret(for: "com.example.web")
        #expect(minter.secret(for: "com.example.web") == first)
        #expect(minter.secret(for: "com.example.app") != first, "each client id has its own sub")
        team.clock.advance(1799)
        #expect(minter.secret(for: "com.example.web") == first)
        #expect(minter.age(for: "com.example.web") == 1799)
        team.clock.advance(1)
        let second = minter.secret(for: "com.example.web")
        #expect(second != first)
        #expect(minter.age(for: "com.example.web") == 0)
        #expect(minter.age(for: "com.example.unused") == nil)
    }

    @Test("a clock that moved backwards gets a fresh secret")
    func clockBackwards() throws {
        let team = TeamFixture()
        let minter = try team.minter()
        let first = minter.secret(for: "c")
        team.clock.advance(-10)
        #expect(minter.secret(for: "c") != first)
    }

    @Test("lifetimes beyond Apple's six-month cap, or too short, are refused", arguments: [Int64(15_777_000), 15_776_941, 59, 0, -1])
    func lifetimeBounds(lifetime: Int64) {
        #expect(throws: ClientSecretError(code: .invalidLifetime)) { try TeamFixture().minter(lifetime: lifetime) }
    }

    @Test("a key that is not a P-256 PKCS#8 PEM is a clear error", arguments: ["", "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n", "not a key"])
    func invalidKey(pem: String) {
        #expect(throws: ClientSecretError(code: .invalidPrivateKey)) { try ClientSecretMinter(teamID: "T", keyID: "K", privateKeyPEM: pem) }
    }
}

@Suite("Simulator's client-secret validation")
struct ClientSecretValidationTests {
    @Test("accepts what the relying party mints (two independent implementations agree)")
    func accepts() throws {
        let team = TeamFixture()
        let secret = try team.minter().secret(for: "com.example.web")
        #expect(team.validator.validate(secret, clientID: "com.example.web", now: team.clock.now) == nil)
    }

    @Test("rejects the relying party's secret once expired, and for another client id")
    func expiryAndSubject() throws {
        let team = TeamFixture()
        let secret = try team.minter(lifetime: 600).secret(for: "com.example.web")
        #expect(team.validator.validate(secret, clientID: "com.example.app", now: team.clock.now) == .subject)
        #expect(team.validator.validate(secret, clientID: "COM.EXAMPLE.WEB", now: team.clock.now) == .subject, "case-sensitive")
        #expect(team.validator.validate(secret, clientID: "com.example.web", now: team.clock.now + 600) == .expired)
    }

    struct Forgery: CustomTestStringConvertible, Sendable {
        let name: String
        let expected: ClientSecretValidator.Failure
        let make: @Sendable (TeamFixture) -> String
        var testDescription: String { name }
    }

    static let forgeries: [Forgery] = [
        Forgery(name: "not a JWS", expected: .malformed) { _ in "abc" },
        Forgery(name: "DER signature", expected: .derSignature) { $0.forge(der: true) },
        Forgery(name: "alg HS256", expected: .algorithm) { $0.forge(header: ["alg": "HS256", "kid": $0.keyID]) },
        Forgery(name: "alg none", expected: .algorithm) { $0.forge(header: ["alg": "none", "kid": $0.keyID]) },
        Forgery(name: "unknown kid", expected: .unknownKey) { $0.forge(header: ["alg": "ES256", "kid": "ZZZ9999999"]) },
        Forgery(name: "signed by another key", expected: .badSignature) { $0.forge(signWith: P256.Signing.PrivateKey()) },
        Forgery(name: "wrong iss", expected: .issuer) { t in
            t.forge(claims: ["iss": "XXXXXXXXXX", "iat": t.clock.now, "exp": t.clock.now + 60, "aud": "https://appleid.apple.com", "sub": "com.example.web"])
        },
        Forgery(name: "wrong aud", expected: .audience) { t in
            t.forge(claims: ["iss": t.teamID, "iat": t.clock.now, "exp": t.clock.now + 60, "aud": "https://appleid.apple.com/", "sub": "com.example.web"])
        },
        Forgery(name: "exp beyond six months", expected: .tooLong) { t in
            t.forge(claims: ["iss": t.teamID, "iat": t.clock.now, "exp": t.clock.now + 15_777_001, "aud": "https://appleid.apple.com", "sub": "com.example.web"])
        },
        Forgery(name: "missing iat", expected: .missingClaim) { t in
            t.forge(claims: ["iss": t.teamID, "exp": t.clock.now + 60, "aud": "https://appleid.apple.com", "sub": "com.example.web"])
        },
        Forgery(name: "exp as a string", expected: .missingClaim) { t in
            t.forge(claims: ["iss": t.teamID, "iat": t.clock.now, "exp": "\(t.clock.now + 60)", "aud": "https://appleid.apple.com", "sub": "com.example.web"])
        },
    ]

    @Test("rejects each forgery with its reason", arguments: forgeries)
    func rejects(_ forgery: Forgery) {
        let team = TeamFixture()
        #expect(team.validator.validate(forgery.make(team), clientID: "com.example.web", now: team.clock.now) == forgery.expected)
    }
}

import Crypto
import Foundation
import NIOConcurrencyHelpers

/// Why a client secret cannot be made.
public struct ClientSecretError: Error, Equatable, CustomStringConvertible {
    public enum Code: String, Sendable { case invalidPrivateKey = "invalid_private_key", invalidLifetime = "invalid_lifetime" }
    public var code: Code
    public var description: String {
        switch code {
        case .invalidPrivateKey: return "the Sign in with Apple key is not a PEM PKCS#8 P-256 private key (AuthKey_<key id>.p8)"
        case .invalidLifetime: return "a client secret lifetime must be between 1 minute and 15,777,000 s (Apple's cap, about 6 months)"
        }
    }
}

/// Mints the `client_secret` Apple's token and revoke endpoints require: an ES256 JWT signed
/// with the team's Sign in with Apple key (apple-sign-in.md §2).
///
/// Header `alg: ES256`, `kid`; claims `iss` (team), `iat`, `exp`, `aud`
/// (`https://appleid.apple.com`), `sub` (the client id the request names); signature raw R‖S
/// (never DER). Secrets are cached per client id and minted again once half their lifetime has
/// passed, so a request never carries one close to expiry.
public final class ClientSecretMinter: Sendable {
    /// Apple rejects an `exp` more than this many seconds after its own clock.
    public static let maximumLifetimeSeconds: Int64 = 15_777_000
    static let audience = "https://appleid.apple.com"

    private let teamID: String
    private let keyID: String
    private let key: P256.Signing.PrivateKey
    private let lifetime: Int64
    private let now: @Sendable () -> Int64
    private let backdate: Int64
    private let cache = NIOLockedValueBox<[String: Minted]>([:])

    struct Minted {
        var secret: String
        /// Our clock at minting (its `iat` is `backdate` earlier).
        var mintedAt: Int64
    }

    /// - Parameters:
    ///   - privateKeyPEM: the `.p8` file's content.
    ///   - lifetime: seconds from `iat` to `exp`; default one day. At most 15,777,000 s less a
    ///     minute of margin for clock skew.
    ///   - backdate: seconds `iat` is set in the past (`apple.clock_skew`), so that Apple's clock
    ///     running behind ours does not find the secret issued in the future.
    ///   - now: the clock, in whole seconds since 1970 (injectable for tests).
    public init(
        teamID: String, keyID: String, privateKeyPEM: String, lifetime: Int64 = 86_400, backdate: Int64 = 60,
        now: @escaping @Sendable () -> Int64 = { Int64(Date().timeIntervalSince1970) }
    ) throws {
        guard lifetime >= 60, lifetime <= Self.maximumLifetimeSeconds - 60 else { throw ClientSecretError(code: .invalidLifetime) }
        do {
            self.key = try P256.Signing.PrivateKey(pemRepresentation: privateKeyPEM)
        } catch {
            throw ClientSecretError(code: .invalidPrivateKey)
        }
        self.teamID = teamID
        self.keyID = keyID
        self.lifetime = lifetime
        self.backdate = max(0, backdate)
        self.now = now
    }

    /// The secret to send with `client_id` = `clientID`. When a new one cannot be signed, the
    /// previous one is kept while it lasts (and the failure counted: `mintFailures`).
    public func secret(for clientID: String) -> String {
        let now = self.now()
        return cache.withLockedValue { cache in
            if let minted = cache[clientID], now - minted.mintedAt < lifetime / 2, now >= minted.mintedAt {
                return minted.secret
            }
            guard let secret = mint(clientID: clientID, issuedAt: now - backdate) else {
                failures.withLockedValue { $0 += 1 }
                return cache[clientID]?.secret ?? ""
            }
            let minted = Minted(secret: secret, mintedAt: now)
            cache[clientID] = minted
            return minted.secret
        }
    }

    /// Seconds since the cached secret for `clientID` was minted (nil: none yet). For a metric.
    public func age(for clientID: String) -> Int64? {
        let now = self.now()
        return cache.withLockedValue { $0[clientID].map { now - $0.mintedAt } }
    }

    /// Seconds until the cached secret for `clientID` expires (nil: none yet). Normally at least
    /// half the lifetime; falling toward 0 means minting has been failing.
    public func expiresIn(for clientID: String) -> Int64? {
        let now = self.now()
        return cache.withLockedValue { $0[clientID].map { $0.mintedAt - backdate + lifetime - now } }
    }

    /// Secrets that could not be signed so far.
    public var mintFailures: Int { failures.withLockedValue { $0 } }
    private let failures = NIOLockedValueBox(0)

    func mint(clientID: String, issuedAt: Int64) -> String? {
        let header: [String: Any] = ["alg": "ES256", "kid": keyID]
        // Whole seconds: Apple's clock compares integers (jwt-kit's fractional dates fail).
        let claims: [String: Any] = ["iss": teamID, "iat": issuedAt, "exp": issuedAt + lifetime, "aud": Self.audience, "sub": clientID]
        let signingInput = Self.encodedJSON(header) + "." + Self.encodedJSON(claims)
        // Raw R‖S (64 bytes): Apple rejects DER-encoded ECDSA signatures (TN3107).
        guard let signature = try? key.signature(for: Data(signingInput.utf8)).rawRepresentation, signature.count == 64 else { return nil }
        return signingInput + "." + Base64URL.encode(signature)
    }

    private static func encodedJSON(_ object: [String: Any]) -> String {
        Base64URL.encode((try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes])) ?? Data())
    }
}

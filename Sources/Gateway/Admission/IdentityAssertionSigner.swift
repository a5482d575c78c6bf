import AppleID
import Crypto
import Foundation

/// `X-Auth-Assertion`: a short-lived ES256 JWT the gateway signs for each forwarded identity,
/// so an upstream can prove the identity headers came from the gateway (verify with the keys at
/// `/_auth/jwks.json`; check `iss`, `aud` = the route name, `exp`).
struct IdentityAssertionSigner: Sendable {
    let key: P256.Signing.PrivateKey
    let keyID: String
    let issuer: String
    /// Seconds.
    let ttl: Int64

    init(pem: String, issuer: String, ttl: Int64) throws {
        key = try P256.Signing.PrivateKey(pemRepresentation: pem)
        // RFC 7638-style thumbprint, shortened: stable across restarts for one key file.
        keyID = String(Base64URL.encode(SHA256.hash(data: key.publicKey.x963Representation)).prefix(16))
        self.issuer = issuer
        self.ttl = ttl
    }

    /// A signed assertion for `profile`, valid from `now` (seconds) for `ttl`.
    func sign(_ profile: UserProfileClaims, audience: String, now: Int64) -> String {
        var claims: [String: Any] = ["iss": issuer, "aud": audience, "sub": profile.sub, "iat": now, "exp": now + ttl]
        if let v = profile.email { claims["email"] = v }
        if let v = profile.emailVerified { claims["email_verified"] = v }
        if let v = profile.name { claims["name"] = v }
        if let v = profile.account { claims["account"] = v }
        if let v = profile.formerSub { claims["former_sub"] = v }
        return sign(claims)
    }

    /// A compact JWS (ES256, this key's `kid`, `typ` `type`) of `claims`: assertions (`JWT`)
    /// and the app's events (`AppEvents.type`).
    func sign(_ claims: [String: Any], type: String = "JWT") -> String {
        let header = #"{"alg":"ES256","kid":"\#(keyID)","typ":"\#(type)"}"#
        let payload = (try? JSONSerialization.data(withJSONObject: claims, options: [.sortedKeys])) ?? Data("{}".utf8)
        let input = Base64URL.encode(Array(header.utf8)) + "." + Base64URL.encode(payload)
        let signature = (try? key.signature(for: Array(input.utf8)).rawRepresentation) ?? Data()
        return input + "." + Base64URL.encode(signature)
    }

    /// The JWK Set served at `/_auth/jwks.json`.
    var jwks: [String: Any] {
        let raw = key.publicKey.rawRepresentation  // x ‖ y
        return ["keys": [[
            "kty": "EC", "crv": "P-256", "alg": "ES256", "use": "sig", "kid": keyID,
            "x": Base64URL.encode(raw.prefix(32)), "y": Base64URL.encode(raw.suffix(32)),
        ]]]
    }
}

/// The claims an assertion carries.
struct UserProfileClaims {
    var sub: String
    var email: String?
    var emailVerified: Bool?
    var name: String?
    /// The linked legacy account id.
    var account: String? = nil
    /// The user's `sub` before an app transfer, during the transfer period after their mapping.
    var formerSub: String? = nil
}

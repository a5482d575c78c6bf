import Crypto
import Foundation

/// A verified Sign in with Apple identity (apple-sign-in.md §6.2). `sub` is the identity; the
/// email is a contact detail, never an identifier.
public struct AppleIdentity: Sendable, Equatable {
    public var subject: String
    /// The client id the token was issued to (one of `apple.client_ids`).
    public var audience: String
    public var email: String?
    public var emailVerified: Bool?
    public var isPrivateEmail: Bool?
    /// 0 unsupported, 1 unknown, 2 likely real (native, first sign-in only).
    public var realUserStatus: Int?
    /// Present during the 60 days after an app transfer.
    public var transferSubject: String?
    public var issuedAt: Int64
    public var expiresAt: Int64
    /// The `nonce` claim, as Apple put it in the token.
    public var nonce: String? = nil
    /// `nonce_supported` (false: the platform sent no nonce; nil: the claim is absent).
    public var nonceSupported: Bool? = nil
}

/// Verifies identity tokens from the web flow (`/auth/token`) and from native apps: RS256
/// pinned, `kid` only from Apple's set (no default key), `iss`, `aud` ∈ client ids,
/// `exp`/`iat` with a small leeway, and the nonce rule of §6.3.
public struct IdentityTokenVerifier: Sendable {
    private let core: AppleJWSVerifier

    /// - Parameters:
    ///   - clientIDs: `apple.client_ids`: the Services ID and any App IDs.
    ///   - leeway: seconds of clock skew tolerated (default 5).
    ///   - now: the clock in whole seconds (injectable for tests).
    public init(keySet: AppleKeySet, clientIDs: [String], leeway: Int64 = 5, now: @escaping @Sendable () -> Int64 = { Int64(Date().timeIntervalSince1970) }) {
        core = AppleJWSVerifier(keySet: keySet, clientIDs: clientIDs, leeway: leeway, now: now)
    }

    /// - Parameters:
    ///   - expectedNonce: the nonce this login sent to Apple (nil: none was sent).
    ///   - code: the authorization code delivered beside the token (the web flow's `code
    ///     id_token` callback): the token's `c_hash` must be its hash (OIDC Core §3.3.2.11), so a
    ///     token lifted from another sign-in cannot ride along with this code.
    public func verify(_ token: String, expectedNonce: String?, code: String? = nil) async throws(AppleTokenRejection) -> AppleIdentity {
        let verified = try await core.verify(token, requireExpiry: true)
        let claims = verified.claims
        guard let subject = claims["sub"] as? String, !subject.isEmpty,
              let iat = AppleJWSVerifier.seconds(claims["iat"]), let exp = AppleJWSVerifier.seconds(claims["exp"]) else { throw .missingClaim }
        if let expectedNonce {
            if let nonce = claims["nonce"] as? String {
                guard Self.constantTimeEqual(nonce, expectedNonce) else { throw .nonceMismatch }
            } else {
                // Without a nonce claim, proceed only when the platform says it has no nonces.
                guard try AppleJWSVerifier.boolean(claims["nonce_supported"]) == false else { throw .nonceMissing }
            }
        }
        if let code {
            guard let hash = claims["c_hash"] as? String, Self.constantTimeEqual(hash, Self.halfHash(code)) else { throw .codeHash }
        }
        // 0 unsupported, 1 unknown, 2 likely real. Anything else (a value Apple adds later, a
        // string) is treated as unknown: the header is omitted, the sign-in goes on.
        let realUserStatus = AppleJWSVerifier.seconds(claims["real_user_status"]).flatMap { (0...2).contains($0) ? Int($0) : nil }
        let email = claims["email"] as? String
        return AppleIdentity(
            subject: subject, audience: verified.audience, email: email,
            emailVerified: try AppleJWSVerifier.boolean(claims["email_verified"]),
            isPrivateEmail: try AppleJWSVerifier.privateEmail(claims["is_private_email"], email: email),
            realUserStatus: realUserStatus, transferSubject: claims["transfer_sub"] as? String,
            issuedAt: iat, expiresAt: exp, nonce: claims["nonce"] as? String, nonceSupported: try AppleJWSVerifier.boolean(claims["nonce_supported"]))
    }

    /// OIDC's hash of a code: the left half of its SHA-256, base64url.
    static func halfHash(_ value: String) -> String {
        Base64URL.encode(SHA256.hash(data: Data(value.utf8)).prefix(16))
    }

    /// Equality whose time does not depend on where the strings differ.
    public static func constantTimeEqual(_ a: String, _ b: String) -> Bool {
        let x = Array(a.utf8), y = Array(b.utf8)
        guard x.count == y.count else { return false }
        var difference: UInt8 = 0
        for i in 0..<x.count { difference |= x[i] ^ y[i] }
        return difference == 0
    }
}

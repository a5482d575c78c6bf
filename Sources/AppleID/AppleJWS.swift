import Foundation
import _CryptoExtras

/// Why Apple-signed JWS (identity token or notification) was refused. Bounded: a log field.
public enum AppleTokenRejection: String, Error, Sendable, CaseIterable {
    case malformed = "not a compact JWS with JSON header and claims"
    case algorithm = "alg is not RS256"
    case embeddedKey = "header carries key material (jwk, jku, x5u, x5c) or crit"
    case unknownKey = "kid is not in Apple's key set"
    case keysUnavailable = "Apple's key set could not be fetched"
    case signature = "signature does not verify"
    case issuer = "iss is not https://appleid.apple.com"
    case audience = "aud is not one of the configured client ids"
    case expired = "token has expired"
    case issuedInFuture = "iat is in the future"
    case missingClaim = "a required claim is missing or has the wrong type"
    case nonceMissing = "a nonce was sent but the token has none"
    case nonceMismatch = "nonce does not match"
    case codeHash = "c_hash is missing or does not match the authorization code"
    case claimType = "a boolean claim is neither true nor false"
    case events = "events is neither a JSON object nor a JSON string of one"
    case stale = "issued longer ago than a notification may be acted on"

    /// Transient: Apple's keys could not be fetched; the caller should answer 503, not 401.
    public var isTransient: Bool { self == .keysUnavailable }
}

/// Verification shared by identity tokens and notifications: RS256 pinned, the key looked up
/// only in Apple's set, signature, `iss`, `aud` ∈ client ids, `exp`/`iat` with leeway.
struct AppleJWSVerifier: Sendable {
    static let issuer = "https://appleid.apple.com"
    /// Bound on a token's size before any parsing.
    static let maximumTokenBytes = 16 * 1024

    let keySet: AppleKeySet
    let clientIDs: [String]
    /// Seconds of clock skew tolerated on `exp` and `iat`.
    let leeway: Int64
    let now: @Sendable () -> Int64

    struct Verified {
        var claims: [String: Any]
        var audience: String
    }

    func verify(_ token: String, requireExpiry: Bool) async throws(AppleTokenRejection) -> Verified {
        guard token.utf8.count <= Self.maximumTokenBytes else { throw .malformed }
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3,
              let headerBytes = Base64URL.decode(parts[0]), let claimBytes = Base64URL.decode(parts[1]),
              let signature = Base64URL.decode(parts[2]),
              let header = (try? JSONSerialization.jsonObject(with: Data(headerBytes))) as? [String: Any],
              let claims = (try? JSONSerialization.jsonObject(with: Data(claimBytes))) as? [String: Any]
        else { throw .malformed }
        guard header["alg"] as? String == "RS256" else { throw .algorithm }
        guard ["jwk", "jku", "x5u", "x5c", "crit"].allSatisfy({ header[$0] == nil }) else { throw .embeddedKey }
        guard let kid = header["kid"] as? String else { throw .unknownKey }
        let key: _RSA.Signing.PublicKey
        do {
            key = try await keySet.key(for: kid)
        } catch AppleKeySetError.unavailable {
            throw .keysUnavailable
        } catch {
            throw .unknownKey
        }
        let input = Data("\(parts[0]).\(parts[1])".utf8)
        guard key.isValidSignature(_RSA.Signing.RSASignature(rawRepresentation: signature), for: input, padding: .insecurePKCS1v1_5) else {
            throw .signature
        }
        guard claims["iss"] as? String == Self.issuer else { throw .issuer }
        let audiences: [String]
        if let single = claims["aud"] as? String { audiences = [single] }
        else if let list = claims["aud"] as? [String] { audiences = list }
        else { throw .audience }
        guard let audience = audiences.first(where: { clientIDs.contains($0) }) else { throw .audience }
        let now = self.now()
        let exp = Self.seconds(claims["exp"])
        if requireExpiry, exp == nil { throw .missingClaim }
        if let exp, exp <= now - leeway { throw .expired }
        guard let iat = Self.seconds(claims["iat"]) else { throw .missingClaim }
        guard iat <= now + leeway else { throw .issuedInFuture }
        return Verified(claims: claims, audience: audience)
    }

    /// A whole number of seconds, as JSON numbers arrive from `JSONSerialization`.
    static func seconds(_ value: Any?) -> Int64? {
        guard let value, !(value is String), !isJSONBoolean(value), let number = value as? NSNumber else { return nil }
        let double = number.doubleValue
        guard double.isFinite, abs(double) < 1e15 else { return nil }
        return Int64(double)
    }

    /// Whether a `JSONSerialization` value was a JSON `true`/`false`. (On Linux a JSON number
    /// also casts to `Bool`; only the boolean's `objCType` tells them apart.)
    static func isJSONBoolean(_ value: Any) -> Bool {
        guard let number = value as? NSNumber else { return value is Bool }
        return String(cString: number.objCType) == "c"
    }

    /// Apple sends some booleans as JSON booleans and some as `"true"`/`"false"` (§6.2).
    static func boolean(_ value: Any?) throws(AppleTokenRejection) -> Bool? {
        guard let value else { return nil }
        if isJSONBoolean(value), let b = value as? Bool { return b }
        if let s = value as? String {
            switch s {
            case "true": return true
            case "false": return false
            default: throw .claimType
            }
        }
        throw .claimType
    }

    /// `is_private_email` beside `email`: the claim when Apple sent it (either form). Apple omits
    /// it when the user shares their real address (observed in captured tokens), so an email
    /// without it is private only if it is Apple's relay address; no email, no answer.
    static func privateEmail(_ claim: Any?, email: String?) throws(AppleTokenRejection) -> Bool? {
        if let stated = try boolean(claim) { return stated }
        guard let email, !email.isEmpty else { return nil }
        return email.lowercased().hasSuffix("@privaterelay.appleid.com")
    }
}

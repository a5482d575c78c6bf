import Crypto
import Foundation

/// Apple's checks of a `client_secret` (apple-sign-in.md §2, "SIM validation"). Every failure
/// is `invalid_client`; the reason is for the simulator's `error_description` and logs.
struct ClientSecretValidator {
    /// The team's registered Sign in with Apple keys, by key id.
    var teamID: String
    var keys: [String: P256.Signing.PublicKey]

    static let maximumLifetime: Int64 = 15_777_000
    static let audience = "https://appleid.apple.com"

    enum Failure: String, Error, Equatable {
        case malformed = "client_secret is not a compact JWS"
        case algorithm = "client_secret must be signed with ES256"
        case unknownKey = "client_secret kid is not a key of this team"
        case derSignature = "client_secret signature must be raw R||S (64 bytes), not DER"
        case badSignature = "client_secret signature does not verify"
        case missingClaim = "client_secret lacks iss, iat, exp, aud or sub"
        case issuer = "client_secret iss is not the team id"
        case audience = "client_secret aud must be https://appleid.apple.com"
        case subject = "client_secret sub does not match client_id"
        case expired = "client_secret has expired"
        case tooLong = "client_secret exp is more than 15777000 seconds in the future"
    }

    /// Checks `secret` for a request naming `clientID`, at `now` (seconds since 1970).
    func validate(_ secret: String, clientID: String, now: Int64) -> Failure? {
        guard let jws = CompactJWS.parse(secret) else { return .malformed }
        guard jws.header["alg"] as? String == "ES256" else { return .algorithm }
        guard let kid = jws.header["kid"] as? String, let key = keys[kid] else { return .unknownKey }
        guard jws.signature.count == 64 else {
            return jws.signature.first == 0x30 ? .derSignature : .badSignature
        }
        guard let signature = try? P256.Signing.ECDSASignature(rawRepresentation: jws.signature),
              key.isValidSignature(signature, for: Data(jws.signingInput.utf8)) else { return .badSignature }
        guard let iss = jws.claims["iss"] as? String, let aud = jws.claims["aud"] as? String, let sub = jws.claims["sub"] as? String,
              jws.integerClaim("iat") != nil, let exp = jws.integerClaim("exp") else { return .missingClaim }
        guard iss == teamID else { return .issuer }
        guard aud == Self.audience else { return .audience }
        guard sub == clientID else { return .subject }
        guard now < exp else { return .expired }
        guard exp <= now + Self.maximumLifetime else { return .tooLong }
        return nil
    }
}

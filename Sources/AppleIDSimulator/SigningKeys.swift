import Crypto
import Foundation
import NIOConcurrencyHelpers
import _CryptoExtras

/// The simulator's RS256 keys (identity tokens and notifications), published at `/auth/keys`.
/// Several keys at once, with live rotation: tokens are signed with the newest key.
final class SigningKeys: Sendable {
    struct Key: Sendable {
        var kid: String
        var privateKey: _RSA.Signing.PrivateKey
    }

    private let keys: NIOLockedValueBox<[Key]>

    /// - Parameter count: keys generated at start (Apple publishes several).
    init(count: Int = 2) throws {
        keys = NIOLockedValueBox(try (0..<count).map { _ in try Self.generate() })
    }

    static func generate() throws -> Key {
        let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
        let kid = String((0..<10).map { _ in alphabet.randomElement()! })
        return Key(kid: kid, privateKey: try _RSA.Signing.PrivateKey(keySize: .bits2048))
    }

    var kids: [String] { keys.withLockedValue { $0.map(\.kid) } }

    /// Adds a new key and signs with it from now on; drops the oldest beyond `keep` keys.
    @discardableResult
    func rotate(keep: Int = 3) throws -> String {
        let key = try Self.generate()
        keys.withLockedValue { list in
            list.append(key)
            if list.count > keep { list.removeFirst(list.count - keep) }
        }
        return key.kid
    }

    /// Signs `claims` as an RS256 JWS with the newest key (or the key `kid`).
    func sign(_ claims: [String: Any], kid: String? = nil) throws -> String {
        let key = keys.withLockedValue { list in kid.flatMap { k in list.first { $0.kid == k } } ?? list.last! }
        return try CompactJWS.make(header: ["alg": "RS256", "kid": key.kid], claims: claims) { input in
            try key.privateKey.signature(for: input, padding: .insecurePKCS1v1_5).rawRepresentation
        }
    }

    /// The JWK Set (RFC 7517) of the public keys.
    func jwks() throws -> [String: Any] {
        let list = keys.withLockedValue { $0 }
        return ["keys": try list.map { key -> [String: Any] in
            let primitives = try key.privateKey.publicKey.getKeyPrimitives()
            return [
                "kty": "RSA", "kid": key.kid, "use": "sig", "alg": "RS256",
                "n": CompactJWS.encodeBase64URL(Data(primitives.modulus)),
                "e": CompactJWS.encodeBase64URL(Data(primitives.publicExponent)),
            ]
        }]
    }
}

import Crypto

/// The keys derived from `session.secret_file` (HKDF-SHA256, one label per use) and everything
/// done with them: session ids and their cookies, the store's key for a session, and refresh
/// tokens sealed at rest (DESIGN §3 "Sessions").
///
/// A cookie is `base64url(id ‖ HMAC-SHA256(id ‖ "." ‖ sub)) "." base64url(sub)`: 32 random
/// bytes, their 32-byte tag, and the user the session belongs to — the routing tag that tells
/// the store where the session lives before anything is read (Redis Cluster: the user's hash
/// slot, where the profile, revocation marker and link are too). The tag is checked in constant
/// time before anything else, so a forged cookie never reaches a store, and it binds the user:
/// a cookie moved to another user's slot does not verify.
///
/// Cookies from before (`base64url(id ‖ HMAC-SHA256(id))`, 86 characters, no user) keep working
/// until their sessions expire: their handle has no `sub`, and the store finds them under the
/// session's own key. The two forms cannot be confused: the MAC inputs differ in length (32 bytes
/// against at least 33).
///
/// The store keys a session by SHA-256 of the id: a dump of the store yields no usable cookie.
public struct SessionKeys: Sendable {
    let cookieKey: SymmetricKey
    private let sealingKey: SymmetricKey
    /// HMAC-SHA256 (RFC 2104) with the key's padded blocks hashed once: checking a cookie costs
    /// two SHA-256 updates, no key setup.
    private let innerPrefix: SHA256
    private let outerPrefix: SHA256
    /// The handles of cookies seen lately (a cookie's handle is fixed for the keys' life).
    private let memo = HandleMemo()

    /// Bytes of a session id.
    public static let idLength = 32
    /// Characters of the id-and-tag part of a cookie (64 bytes in unpadded base64url): the whole
    /// of a cookie from before the user was part of it.
    public static let cookieLength = 86
    /// The longest user id a cookie carries (bytes); Apple's are 44.
    public static let maximumSubLength = 255
    /// The shortest secret accepted (bytes).
    public static let minimumSecretLength = 32

    public struct SecretTooShort: Error, CustomStringConvertible {
        public var length: Int
        public var description: String {
            "the session secret has \(length) bytes; at least \(SessionKeys.minimumSecretLength) are required (e.g. `head -c 64 /dev/urandom > session.key`)"
        }
    }

    public init(secret: [UInt8]) throws {
        guard secret.count >= Self.minimumSecretLength else { throw SecretTooShort(length: secret.count) }
        let master = SymmetricKey(data: secret)
        func derive(_ label: String) -> SymmetricKey {
            HKDF<SHA256>.deriveKey(inputKeyMaterial: master, salt: Array("sessiongate".utf8), info: Array(label.utf8), outputByteCount: 32)
        }
        cookieKey = derive("cookie-mac-v1")
        sealingKey = derive("refresh-token-aes-gcm-v1")
        let keyBytes = cookieKey.withUnsafeBytes { Array($0) }  // 32 bytes < the 64-byte block
        var inner = SHA256(), outer = SHA256()
        inner.update(data: keyBytes.map { $0 ^ 0x36 } + [UInt8](repeating: 0x36, count: 64 - keyBytes.count))
        outer.update(data: keyBytes.map { $0 ^ 0x5c } + [UInt8](repeating: 0x5c, count: 64 - keyBytes.count))
        innerPrefix = inner
        outerPrefix = outer
    }

    /// Between the id and the user in a cookie's MAC (made once: hashed on every request).
    private static let userSeparator: [UInt8] = [UInt8(ascii: ".")]

    /// The MAC of `id`, and of `sub` after it when the session carries its user.
    func tag(_ id: [UInt8], sub: [UInt8]? = nil) -> SHA256.Digest {
        var inner = innerPrefix
        inner.update(data: id)
        if let sub {
            inner.update(data: Self.userSeparator)
            inner.update(data: sub)
        }
        var outer = outerPrefix
        inner.finalize().withUnsafeBytes { outer.update(bufferPointer: $0) }
        return outer.finalize()
    }

    /// A fresh random secret (the memory store without `session.secret_file`).
    public static func randomSecret() -> [UInt8] {
        var rng = SystemRandomNumberGenerator()
        return (0..<64).map { _ in UInt8.random(in: .min ... .max, using: &rng) }
    }

    // MARK: session ids and cookies

    /// A new session of `sub`: its cookie value (for the client) and its handle (for the store).
    public func newSession(for sub: String) -> (cookie: String, handle: SessionHandle) {
        var rng = SystemRandomNumberGenerator()
        let id = (0..<Self.idLength).map { _ in UInt8.random(in: .min ... .max, using: &rng) }
        let user = Array(sub.utf8)
        return (Base64URL.encode(id + Array(tag(id, sub: user))) + "." + Base64URL.encode(user), SessionHandle(id: id, sub: sub))
    }

    /// The session a cookie (or bearer token) names, when its tag is ours; `nil` for anything
    /// else (wrong length, bad encoding, forged tag, a user that is not valid text). Costs one
    /// HMAC the first time a cookie is seen, a hash and a comparison after (`HandleMemo`);
    /// touches no store.
    public func handle(forCookie value: Substring) -> SessionHandle? {
        var value = value
        return value.withUTF8 { handle(forCookie: UnsafeRawBufferPointer($0)) }
    }

    /// `handle(forCookie:)` for a cookie's bytes (a slice of a received head): a cookie seen
    /// lately is never made a `String`.
    public func handle(forCookie bytes: UnsafeRawBufferPointer) -> SessionHandle? {
        // Only ASCII verifies: the text is the bytes (anything else decodes to U+FFFD, no base64).
        memo.handle(for: bytes) { verifiedHandle(forCookie: Substring(String(decoding: bytes, as: UTF8.self))) }
    }

    /// `handle(forCookie:)` without the memo: the base64, the HMAC and the SHA-256 every time.
    func verifiedHandle(forCookie value: Substring) -> SessionHandle? {
        let utf8 = value.utf8
        let signed: Substring
        var sub: [UInt8]? = nil
        if utf8.count == Self.cookieLength {
            signed = value
        } else {
            // `<86 characters>.<the user, base64url>`
            let dot = utf8.index(utf8.startIndex, offsetBy: Self.cookieLength, limitedBy: utf8.endIndex)
            guard let dot, dot < utf8.endIndex, utf8[dot] == UInt8(ascii: "."),
                  utf8.distance(from: dot, to: utf8.endIndex) - 1 <= (Self.maximumSubLength * 4 + 2) / 3,
                  let user = Base64URL.decode(value[utf8.index(after: dot)...]), !user.isEmpty else { return nil }
            signed = value[..<dot]
            sub = user
        }
        guard let bytes = Base64URL.decode(signed), bytes.count == 2 * Self.idLength else { return nil }
        let id = Array(bytes[0..<Self.idLength])
        // Constant time: every byte is compared whatever the first difference.
        var difference: UInt8 = 0
        tag(id, sub: sub).withUnsafeBytes { expected in
            for i in 0..<Self.idLength { difference |= expected[i] ^ bytes[Self.idLength + i] }
        }
        guard difference == 0 else { return nil }
        guard let sub else { return SessionHandle(id: id, sub: nil) }
        guard let text = String(validating: sub, as: UTF8.self) else { return nil }
        return SessionHandle(id: id, sub: text)
    }

    // MARK: refresh tokens at rest

    /// AES-GCM with a random nonce; `nonce ‖ ciphertext ‖ tag`, base64url. The session's store
    /// key is authenticated with it, so a sealed token cannot be moved to another session.
    public func seal(_ plaintext: String, for handle: SessionHandle) -> String { seal(plaintext, context: handle.key) }

    /// The plaintext, or nil when the value was not sealed by this key for this session.
    public func open(_ sealed: String, for handle: SessionHandle) -> String? { open(sealed, context: handle.key) }

    /// Seals for a context (authenticated, not encrypted): a session's store key, or
    /// `userContext(sub)` for the refresh tokens kept per user. A value sealed for one context
    /// never opens in another.
    public func seal(_ plaintext: String, context: String) -> String {
        // A SymmetricKey of 32 bytes and a random nonce cannot fail to seal.
        let box = try! AES.GCM.seal(Array(plaintext.utf8), using: sealingKey, authenticating: Array(context.utf8))
        return Base64URL.encode(Array(box.combined!))
    }

    public func open(_ sealed: String, context: String) -> String? {
        guard let bytes = Base64URL.decode(Substring(sealed)), let box = try? AES.GCM.SealedBox(combined: bytes),
              let plain = try? AES.GCM.open(box, using: sealingKey, authenticating: Array(context.utf8)) else { return nil }
        return String(decoding: plain, as: UTF8.self)
    }

    /// The sealing context of a user's stored refresh tokens.
    public static func userContext(_ sub: String) -> String { "user:" + sub }
}

/// Lower-case hex SHA-256 of `text` (store keys for refresh tokens, login bindings).
public func sha256Hex(_ text: String) -> String {
    SessionHandle.hex(Array(SHA256.hash(data: Array(text.utf8))))
}

/// How a store names one session: the hex SHA-256 of its id (never the id itself), and the user
/// it belongs to when the cookie says so (`sub`: where the store keeps it, DESIGN §3). Two handles
/// are the same session when their keys are equal: the user is where a session lives, not which
/// one it is (an invalidation message names a session by its key alone).
public struct SessionHandle: Hashable, Sendable, CustomStringConvertible {
    /// 64 lower-case hex digits.
    public let key: String
    /// The user whose slot holds the session; nil for a session made before cookies carried it.
    public let sub: String?

    init(id: [UInt8], sub: String?) {
        self.key = Self.hex(Array(SHA256.hash(data: id)))
        self.sub = sub
    }

    /// A handle read back from a store (a session list, an invalidation message).
    public init?(key: String, sub: String? = nil) {
        guard key.utf8.count == 64, key.utf8.allSatisfy({ ($0 >= 0x30 && $0 <= 0x39) || ($0 >= 0x61 && $0 <= 0x66) }) else { return nil }
        self.key = key
        self.sub = sub
    }

    /// The handle as one string, for a record that refers to a session (a login's previous
    /// session): `<key>`, or `<key>:<sub>`.
    public var reference: String { sub.map { key + ":" + $0 } ?? key }

    public init?(reference: String) {
        guard let colon = reference.firstIndex(of: ":") else {
            self.init(key: reference)
            return
        }
        self.init(key: String(reference[..<colon]), sub: String(reference[reference.index(after: colon)...]))
    }

    public static func == (a: SessionHandle, b: SessionHandle) -> Bool { a.key == b.key }
    public func hash(into hasher: inout Hasher) { hasher.combine(key) }

    /// Short enough for logs, useless as a credential.
    public var description: String { String(key.prefix(12)) }

    static func hex(_ bytes: [UInt8]) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var out = [UInt8]()
        out.reserveCapacity(bytes.count * 2)
        for b in bytes {
            out.append(digits[Int(b >> 4)])
            out.append(digits[Int(b & 0xf)])
        }
        return String(decoding: out, as: UTF8.self)
    }
}

/// Unpadded base64url (RFC 4648 §5). Decoding is on the hot path (every cookie): a table, no
/// Foundation, one allocation.
enum Base64URL {
    private static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)
    private static let values: [UInt8] = {
        var table = [UInt8](repeating: 0xff, count: 256)
        for (i, c) in alphabet.enumerated() { table[Int(c)] = UInt8(i) }
        return table
    }()

    static func encode(_ bytes: [UInt8]) -> String {
        var out: [UInt8] = []
        out.reserveCapacity((bytes.count * 4 + 2) / 3)
        var i = 0
        while i + 3 <= bytes.count {
            let n = UInt32(bytes[i]) << 16 | UInt32(bytes[i + 1]) << 8 | UInt32(bytes[i + 2])
            out += [alphabet[Int(n >> 18 & 63)], alphabet[Int(n >> 12 & 63)], alphabet[Int(n >> 6 & 63)], alphabet[Int(n & 63)]]
            i += 3
        }
        let rest = bytes.count - i
        if rest > 0 {
            let n = UInt32(bytes[i]) << 16 | (rest == 2 ? UInt32(bytes[i + 1]) << 8 : 0)
            out += [alphabet[Int(n >> 18 & 63)], alphabet[Int(n >> 12 & 63)]]
            if rest == 2 { out.append(alphabet[Int(n >> 6 & 63)]) }
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// nil for any character outside the alphabet, a length of 1 mod 4, or non-zero padding bits.
    static func decode(_ text: Substring) -> [UInt8]? {
        let count = text.utf8.count
        guard count % 4 != 1 else { return nil }
        var out: [UInt8] = []
        out.reserveCapacity(count * 3 / 4)
        var accumulator: UInt32 = 0
        var bits = 0
        for c in text.utf8 {
            let v = values[Int(c)]
            guard v != 0xff else { return nil }
            accumulator = accumulator << 6 | UInt32(v)
            bits += 6
            if bits >= 8 {
                bits -= 8
                out.append(UInt8(truncatingIfNeeded: accumulator >> UInt32(bits)))
            }
        }
        guard accumulator & ((1 << UInt32(bits)) - 1) == 0 else { return nil }
        return out
    }
}

import Foundation

/// base64url without padding (RFC 7515 §2), as JWS uses it.
public enum Base64URL {
    public static func encode<Bytes: Sequence>(_ bytes: Bytes) -> String where Bytes.Element == UInt8 {
        Data(bytes).base64EncodedString()
            .replacingOccurrences(of: "+", with: "-")
            .replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }

    public static func decode(_ text: Substring) -> [UInt8]? {
        guard text.utf8.allSatisfy({ b in
            (b >= 0x30 && b <= 0x39) || (b >= 0x41 && b <= 0x5a) || (b >= 0x61 && b <= 0x7a) || b == UInt8(ascii: "-") || b == UInt8(ascii: "_")
        }) else { return nil }
        var standard = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        switch standard.utf8.count % 4 {
        case 0: break
        case 2: standard += "=="
        case 3: standard += "="
        default: return nil
        }
        return Data(base64Encoded: standard).map { Array($0) }
    }

    /// The claims of a compact JWS, read **without** checking its signature: for a token this
    /// process signed itself, or one only used to bind something a verified step vouches for.
    /// nil unless it has three parts and a JSON object for claims.
    public static func unverifiedClaims(ofJWS token: some StringProtocol) -> [String: Any]? {
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, let payload = decode(Substring(parts[1])) else { return nil }
        return (try? JSONSerialization.jsonObject(with: Data(payload))) as? [String: Any]
    }
}

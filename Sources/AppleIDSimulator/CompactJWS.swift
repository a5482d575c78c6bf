import Foundation

/// A compact JWS as the simulator reads and writes it. Written independently of `AppleID`
/// (which the simulator must not import) so that each side checks the other.
struct CompactJWS {
    var header: [String: Any]
    var claims: [String: Any]
    var signingInput: String
    var signature: [UInt8]

    /// Splits and decodes `header.claims.signature`; nil when it is not a compact JWS with
    /// JSON-object header and claims.
    static func parse(_ token: String) -> CompactJWS? {
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3,
              let headerBytes = decodeBase64URL(parts[0]), let claimBytes = decodeBase64URL(parts[1]),
              let signature = decodeBase64URL(parts[2]),
              let header = (try? JSONSerialization.jsonObject(with: Data(headerBytes))) as? [String: Any],
              let claims = (try? JSONSerialization.jsonObject(with: Data(claimBytes))) as? [String: Any]
        else { return nil }
        return CompactJWS(header: header, claims: claims, signingInput: "\(parts[0]).\(parts[1])", signature: signature)
    }

    /// Serializes and signs: `sign` receives the signing input and returns the signature bytes.
    static func make(header: [String: Any], claims: [String: Any], sign: (Data) throws -> Data) rethrows -> String {
        let h = encodeBase64URL((try? JSONSerialization.data(withJSONObject: header, options: [.sortedKeys])) ?? Data())
        let c = encodeBase64URL((try? JSONSerialization.data(withJSONObject: claims, options: [.sortedKeys])) ?? Data())
        let input = "\(h).\(c)"
        return "\(input).\(encodeBase64URL(try sign(Data(input.utf8))))"
    }

    static func encodeBase64URL(_ data: Data) -> String {
        var s = data.base64EncodedString()
        s = s.replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
        while s.hasSuffix("=") { s.removeLast() }
        return s
    }

    static func decodeBase64URL(_ part: Substring) -> [UInt8]? {
        let allowed = Set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
        guard part.allSatisfy({ allowed.contains($0) }), part.count % 4 != 1 else { return nil }
        var s = String(part).replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        s += String(repeating: "=", count: (4 - s.count % 4) % 4)
        return Data(base64Encoded: s).map(Array.init)
    }

    /// A claim that must be a whole number of seconds (JSON numbers arrive as NSNumber).
    func integerClaim(_ name: String) -> Int64? {
        // A JSON boolean also casts to NSNumber; its objCType ("c") tells it apart.
        guard !(claims[name] is String), let number = claims[name] as? NSNumber, String(cString: number.objCType) != "c" else { return nil }
        let value = number.doubleValue
        guard value == value.rounded(), abs(value) < 1e15 else { return nil }
        return Int64(value)
    }
}

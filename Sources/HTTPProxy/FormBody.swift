/// `application/x-www-form-urlencoded`: query strings and form bodies of the gateway's auth
/// endpoints. The Apple ID simulator has its own reader (`URLEncodedForm`), so that a bug here
/// does not hide on both sides of a sign-in.
public enum FormBody {
    /// Fields in order; nil if a field appears twice (Apple: `invalid_request`) or an escape is bad.
    public static func parse(_ bytes: [UInt8]) -> [String: String]? {
        var fields: [String: String] = [:]
        for pair in bytes.split(separator: UInt8(ascii: "&"), omittingEmptySubsequences: true) {
            let parts = pair.split(separator: UInt8(ascii: "="), maxSplits: 1, omittingEmptySubsequences: false)
            guard let name = decode(parts[0]), let value = decode(parts.count > 1 ? parts[1] : []) else { return nil }
            guard fields[name] == nil else { return nil }
            fields[name] = value
        }
        return fields
    }

    /// Percent-decoding; `+` is a space in form bodies (`plusIsSpace`), itself in a URL. nil
    /// unless every escape is `%` and two hex digits (`%+f`, `%-0` are not) and the decoded
    /// bytes are UTF-8 (never replaced: a value read one way here must not read another way
    /// at the browser or the app).
    public static func decode(_ bytes: ArraySlice<UInt8>, plusIsSpace: Bool = true) -> String? {
        var out: [UInt8] = []
        var i = bytes.startIndex
        while i < bytes.endIndex {
            let b = bytes[i]
            if plusIsSpace, b == UInt8(ascii: "+") {
                out.append(UInt8(ascii: " "))
            } else if b == UInt8(ascii: "%") {
                guard bytes.endIndex - i >= 3, let hi = RequestTarget.hexValue(bytes[i + 1]), let lo = RequestTarget.hexValue(bytes[i + 2]) else { return nil }
                out.append(hi << 4 | lo)
                i += 2
            } else {
                out.append(b)
            }
            i += 1
        }
        // `String(validating:)` needs macOS 15: decode, and refuse if anything was replaced.
        let text = String(decoding: out, as: UTF8.self)
        return text.utf8.elementsEqual(out) ? text : nil
    }

    /// Percent-encodes everything but RFC 3986 unreserved characters.
    public static func escape(_ text: String) -> String {
        let hex = Array("0123456789ABCDEF".utf8)
        var out: [UInt8] = []
        out.reserveCapacity(text.utf8.count)
        for b in text.utf8 {
            let unreserved = (b >= 0x30 && b <= 0x39) || (b >= 0x41 && b <= 0x5a) || (b >= 0x61 && b <= 0x7a)
                || b == UInt8(ascii: "-") || b == UInt8(ascii: ".") || b == UInt8(ascii: "_") || b == UInt8(ascii: "~")
            if unreserved { out.append(b) } else { out += [UInt8(ascii: "%"), hex[Int(b >> 4)], hex[Int(b & 0xf)]] }
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// `name=value&…`, every part escaped.
    public static func encode(_ fields: [(String, String)]) -> String {
        fields.map { "\(escape($0.0))=\(escape($0.1))" }.joined(separator: "&")
    }
}

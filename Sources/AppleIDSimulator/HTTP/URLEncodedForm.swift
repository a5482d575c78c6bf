/// `application/x-www-form-urlencoded` as the simulated Apple reads and writes it: the query
/// of `/auth/authorize`, the bodies of `/auth/token`, `/auth/revoke` and the consent form, and
/// the fields it delivers to a return URL.
///
/// Written apart from the gateway's own parser on purpose: the simulator reads what the
/// gateway writes and the gateway reads what the simulator writes, so one shared parser would
/// hide its own bugs on both sides. It is at least as strict as Apple is documented to be
/// (apple-sign-in.md §1.5, §3.5: a duplicated parameter is `invalid_request`; form data that
/// is not percent-encoded is refused):
///
/// - `&` separates fields; empty fields (`a=1&&b=2`, a trailing `&`) are skipped. A field
///   without `=` has the empty value; a field with an empty name is refused.
/// - `+` is a space, in names and values; `%` must be followed by exactly two hex digits.
/// - Raw bytes are those RFC 3986 §3.4 allows in a query (unreserved, sub-delims, `:@/?`);
///   anything else raw (a space, a control, a non-ASCII byte, `"#<>[\]^`{|}`) is refused.
/// - Decoded names and values must be UTF-8.
/// - A name may appear once, compared after decoding (`a=1&%61=2` repeats `a`).
enum URLEncodedForm {
    /// Why a form was refused; `offset` is where in the input the problem starts.
    enum Failure: Error, Equatable, CustomStringConvertible {
        case duplicateName(String)
        case badEscape(offset: Int)
        case unescapedByte(UInt8, offset: Int)
        case notUTF8(offset: Int)
        case emptyName(offset: Int)

        /// Short and bounded (a repeated name is cut at 32 bytes): it goes into `error_description`.
        var description: String {
            switch self {
            case .duplicateName(let name): return "duplicated parameter '\(name.prefix(32))'"
            case .badEscape(let offset): return "malformed percent-escape at byte \(offset)"
            case .unescapedByte(let byte, let offset): return "byte 0x\(String(byte, radix: 16)) at \(offset) is not percent-encoded"
            case .notUTF8(let offset): return "the field at byte \(offset) is not UTF-8"
            case .emptyName(let offset): return "the field at byte \(offset) has no name"
            }
        }
    }

    /// The fields of `bytes` by name, or why it is not a form Apple would accept.
    static func parse(_ bytes: [UInt8]) -> Result<[String: String], Failure> {
        var fields: [String: String] = [:]
        var reader = FieldReader()
        for (offset, byte) in bytes.enumerated() {
            if let failure = reader.read(byte, at: offset, into: &fields) { return .failure(failure) }
        }
        if let failure = reader.finish(at: bytes.count, into: &fields) { return .failure(failure) }
        return .success(fields)
    }

    static func parse(_ text: Substring) -> Result<[String: String], Failure> { parse(Array(text.utf8)) }

    /// `name=value&…` with every byte but RFC 3986's unreserved ones (`A-Z a-z 0-9 - . _ ~`)
    /// percent-encoded, a space as `%20` (Apple's advice for `scope`, apple-sign-in.md §11).
    static func encode(_ fields: [(String, String)]) -> String {
        var out: [UInt8] = []
        for (index, (name, value)) in fields.enumerated() {
            if index > 0 { out.append(UInt8(ascii: "&")) }
            appendEscaped(name, to: &out)
            out.append(UInt8(ascii: "="))
            appendEscaped(value, to: &out)
        }
        return String(decoding: out, as: UTF8.self)
    }

    private static func appendEscaped(_ text: String, to out: inout [UInt8]) {
        let digits: [UInt8] = Array("0123456789ABCDEF".utf8)
        for byte in text.utf8 {
            if isUnreserved(byte) {
                out.append(byte)
            } else {
                out.append(UInt8(ascii: "%"))
                out.append(digits[Int(byte / 16)])
                out.append(digits[Int(byte % 16)])
            }
        }
    }

    /// RFC 3986 §2.3.
    static func isUnreserved(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "0")...UInt8(ascii: "9"): return true
        case UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "~"): return true
        default: return false
        }
    }

    /// What RFC 3986 §3.4 lets a query carry unescaped besides the unreserved bytes: sub-delims
    /// (`&`, `=` and `+` have their form meaning and are handled before this), `:`, `@`, `/`, `?`.
    static func mayAppearRaw(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "!"), UInt8(ascii: "$"), UInt8(ascii: "'"), UInt8(ascii: "("), UInt8(ascii: ")"), UInt8(ascii: "*"), UInt8(ascii: ","),
             UInt8(ascii: ";"), UInt8(ascii: ":"), UInt8(ascii: "@"), UInt8(ascii: "/"), UInt8(ascii: "?"):
            return true
        default:
            return isUnreserved(byte)
        }
    }

    /// `bytes` as a string if they are UTF-8: decoding replaces a bad sequence with U+FFFD, so
    /// the bytes come back unchanged only from valid UTF-8 (`String(validating:)` needs macOS 15).
    static func utf8(_ bytes: [UInt8]) -> String? {
        let text = String(decoding: bytes, as: UTF8.self)
        return text.utf8.elementsEqual(bytes) ? text : nil
    }

    static func hexDigit(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return byte - UInt8(ascii: "0")
        case UInt8(ascii: "A")...UInt8(ascii: "F"): return byte - UInt8(ascii: "A") + 10
        case UInt8(ascii: "a")...UInt8(ascii: "f"): return byte - UInt8(ascii: "a") + 10
        default: return nil
        }
    }
}

/// Reads a form one byte at a time: the field being built, and where a percent-escape is.
private struct FieldReader {
    private enum Escape {
        case none
        case expectingHigh(start: Int)
        case expectingLow(start: Int, high: UInt8)
    }

    private var name: [UInt8] = []
    private var value: [UInt8] = []
    private var inValue = false
    private var fieldStart = 0
    private var escape = Escape.none

    mutating func read(_ byte: UInt8, at offset: Int, into fields: inout [String: String]) -> URLEncodedForm.Failure? {
        switch escape {
        case .expectingHigh(let start):
            guard let high = URLEncodedForm.hexDigit(byte) else { return .badEscape(offset: start) }
            escape = .expectingLow(start: start, high: high)
            return nil
        case .expectingLow(let start, let high):
            guard let low = URLEncodedForm.hexDigit(byte) else { return .badEscape(offset: start) }
            escape = .none
            append(high << 4 | low)
            return nil
        case .none:
            break
        }
        switch byte {
        case UInt8(ascii: "&"):
            let failure = finish(at: offset, into: &fields)
            fieldStart = offset + 1
            return failure
        case UInt8(ascii: "=") where !inValue:
            inValue = true
        case UInt8(ascii: "+"):
            append(UInt8(ascii: " "))
        case UInt8(ascii: "%"):
            escape = .expectingHigh(start: offset)
        default:
            guard byte == UInt8(ascii: "=") || URLEncodedForm.mayAppearRaw(byte) else { return .unescapedByte(byte, offset: offset) }
            append(byte)
        }
        return nil
    }

    /// Ends the field at `offset` (a `&` or the end of input) and stores it.
    mutating func finish(at offset: Int, into fields: inout [String: String]) -> URLEncodedForm.Failure? {
        switch escape {
        case .expectingHigh(let start), .expectingLow(let start, _): return .badEscape(offset: start)
        case .none: break
        }
        defer {
            name.removeAll(keepingCapacity: true)
            value.removeAll(keepingCapacity: true)
            inValue = false
        }
        if offset == fieldStart { return nil }
        guard !name.isEmpty else { return .emptyName(offset: fieldStart) }
        guard let decodedName = URLEncodedForm.utf8(name), let decodedValue = URLEncodedForm.utf8(value) else {
            return .notUTF8(offset: fieldStart)
        }
        guard fields[decodedName] == nil else { return .duplicateName(decodedName) }
        fields[decodedName] = decodedValue
        return nil
    }

    private mutating func append(_ byte: UInt8) {
        if inValue { value.append(byte) } else { name.append(byte) }
    }
}

/// How a request's body is delimited, from its head (RFC 9112 §6.3), refusing every head whose
/// framing two parsers could read differently (`docs/security.md`, *HTTP/1.1 framing*): one
/// `Content-Length` of digits only, or one `Transfer-Encoding` that is exactly `chunked` in
/// HTTP/1.1, never both. Neither may end in HTAB: RFC 9110 trims it, but llhttp refuses it, and
/// a backend reading `chunked\t` as an unknown coding would frame the body differently.
enum MessageFraming {
    static func request(_ head: WireHead) throws(WireError) -> BodyDecoder.Framing {
        var length: Int? = nil
        var lengths = 0
        var encodings = 0
        for field in head.fields {
            if head.nameIs(field, "content-length") {
                lengths += 1
                if head.hasTrailingTab(field) { throw .malformed("invalid Content-Length") }
                length = head.bytes.withUnsafeReadableBytes { raw in
                    Self.decimal(UnsafeRawBufferPointer(rebasing: raw[Int(field.valueStart)..<Int(field.valueStart + field.valueLength)]))
                }
                if length == nil { throw .malformed("invalid Content-Length") }
            } else if head.nameIs(field, "transfer-encoding") {
                encodings += 1
                guard head.valueIs(field, "chunked"), !head.hasTrailingTab(field) else { throw .malformed("unsupported Transfer-Encoding") }
            }
        }
        if lengths > 1 { throw .malformed("duplicate Content-Length") }
        if encodings > 1 { throw .malformed("duplicate Transfer-Encoding") }
        if encodings > 0 {
            if lengths > 0 { throw .malformed("both Content-Length and Transfer-Encoding") }
            if head.version.minor == 0 { throw .malformed("Transfer-Encoding in HTTP/1.0") }
            return .chunked
        }
        return .contentLength(length ?? 0)
    }

    /// 1 to 18 ASCII digits (no sign, no list, no space): nil otherwise.
    static func decimal(_ bytes: UnsafeRawBufferPointer) -> Int? {
        guard !bytes.isEmpty, bytes.count <= 18 else { return nil }
        var value = 0
        for byte in bytes {
            let digit = byte &- 0x30
            guard digit <= 9 else { return nil }
            value = value * 10 + Int(digit)
        }
        return value
    }
}

extension WireHead {
    /// Whether an HTAB followed the value on its line (trimmed from the value).
    func hasTrailingTab(_ field: WireField) -> Bool {
        let end = field.valueStart + field.valueLength
        guard end + 2 != field.lineEnd else { return false }
        return bytes.withUnsafeReadableBytes { raw in raw[Int(end)..<Int(field.lineEnd - 2)].contains(0x09) }
    }
}

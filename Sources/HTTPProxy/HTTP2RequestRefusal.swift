import NIOHTTP2

/// Why an HTTP/2 request's header block is not forwarded. Every case but `tooLarge` makes the
/// request malformed (RFC 9113 §8.1.1): a stream error of type PROTOCOL_ERROR, answered with
/// RST_STREAM and never forwarded. `tooLarge` is answered 431, as for HTTP/1.1.
enum HTTP2RequestRefusal: Error, Equatable, CustomStringConvertible {
    /// A pseudo-header after a regular field (RFC 9113 §8.3).
    case pseudoHeaderAfterField(String)
    case duplicatePseudoHeader(String)
    /// Not one of `:method`, `:scheme`, `:path`, `:authority` (`:status` included).
    case unknownPseudoHeader(String)
    /// `:method`, `:scheme` or `:path` is absent (RFC 9113 §8.3.1).
    case missingPseudoHeader(String)
    /// `:method` is not a method the proxy knows.
    case invalidMethod
    /// `:scheme` other than `http` or `https`.
    case invalidScheme
    /// `:path` empty, not origin-form (`/…`), `*` for another method than OPTIONS, or holding a
    /// byte a request target may not.
    case invalidPath
    /// `CONNECT`, plain or extended (`:protocol`, RFC 8441): neither is offered.
    case connect
    /// A field name with an upper-case letter (RFC 9113 §8.2.1).
    case upperCaseName
    /// An empty field name, or one with a character that is not a token's.
    case invalidName
    /// `connection`, `keep-alive`, `proxy-connection`, `transfer-encoding` or `upgrade`
    /// (RFC 9113 §8.2.2).
    case connectionSpecificField(String)
    /// `te` with a value other than `trailers` (RFC 9113 §8.2.2).
    case teNotTrailers
    /// CR, LF or NUL in a name or value (RFC 9113 §8.2.1).
    case forbiddenCharacter
    /// Another control character in a value.
    case invalidValue
    /// A value starting or ending with a space or tab (RFC 9113 §8.2.1).
    case surroundingWhitespace
    /// Neither `:authority` nor `host`.
    case missingAuthority
    /// `:authority` or `host` that is not a host (and port), or several `host` fields.
    case invalidAuthority
    /// `:authority` and `host` name different hosts (RFC 9113 §8.3.1).
    case authorityHostMismatch
    /// The HEADERS frame ended the stream, but `content-length` announces a body.
    case contentLengthWithoutBody
    /// A `content-length` that is not a number, or several that differ.
    case invalidContentLength
    /// The wire engine's parser refused the head made from the block (a defence in depth: the
    /// checks above let nothing through that it refuses).
    case malformedHead(String)
    /// The head made from the block is over `server.limits` (431).
    case tooLarge(String)

    /// Whether the answer is RST_STREAM PROTOCOL_ERROR (else 431).
    var isStreamError: Bool {
        if case .tooLarge = self { return false }
        return true
    }

    var errorCode: HTTP2ErrorCode { .protocolError }

    var description: String {
        switch self {
        case .pseudoHeaderAfterField(let name): return "pseudo-header \(name) after a regular field"
        case .duplicatePseudoHeader(let name): return "duplicate pseudo-header \(name)"
        case .unknownPseudoHeader(let name): return "unknown pseudo-header \(name)"
        case .missingPseudoHeader(let name): return "missing pseudo-header \(name)"
        case .invalidMethod: return "invalid :method"
        case .invalidScheme: return "invalid :scheme"
        case .invalidPath: return "invalid :path"
        case .connect: return "CONNECT is not offered"
        case .upperCaseName: return "upper-case field name"
        case .invalidName: return "invalid field name"
        case .connectionSpecificField(let name): return "connection-specific field \(name)"
        case .teNotTrailers: return "te other than trailers"
        case .forbiddenCharacter: return "CR, LF or NUL in a field"
        case .invalidValue: return "control character in a field value"
        case .surroundingWhitespace: return "whitespace around a field value"
        case .missingAuthority: return "neither :authority nor host"
        case .invalidAuthority: return "invalid :authority or host"
        case .authorityHostMismatch: return ":authority and host differ"
        case .contentLengthWithoutBody: return "content-length without a body"
        case .invalidContentLength: return "invalid content-length"
        case .malformedHead(let reason): return "malformed head: \(reason)"
        case .tooLarge(let reason): return reason
        }
    }
}

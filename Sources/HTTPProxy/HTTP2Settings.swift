import NIOCore

/// HTTP/2 to clients: where it is spoken and how each connection is bounded (`server.tls.alpn`,
/// `server.http2_cleartext` and `server.http2` in the file; `Gateway` converts). Every default
/// is the file's default.
public struct HTTP2Settings: Sendable, Equatable {
    /// The TLS listener offers `h2` by ALPN (the context's protocols say so; this says whether
    /// to look at what was negotiated at all: without it the pipeline is HTTP/1's alone).
    public var overTLS: Bool
    /// A listener without TLS takes HTTP/2 with prior knowledge (h2c): a connection whose first
    /// bytes are the HTTP/2 preface.
    public var cleartext: Bool
    /// SETTINGS_MAX_CONCURRENT_STREAMS; a stream over it is refused (REFUSED_STREAM).
    public var maxConcurrentStreams: Int
    /// SETTINGS_MAX_HEADER_LIST_SIZE, and the bound on one header block's HEADERS and
    /// CONTINUATION bytes; over it: GOAWAY.
    public var maxHeaderListSize: Int
    /// Stream resets a client may send within `streamResetWindow`; one more: GOAWAY
    /// (CVE-2023-44487).
    public var maxStreamResets: Int
    public var streamResetWindow: TimeAmount
    /// Stream errors (malformed requests, resets the server sends) a client may cause within
    /// `streamResetWindow`; one more: GOAWAY.
    public var maxStreamErrors: Int = 200
    /// PING, SETTINGS, PRIORITY and other control frames a client may send within
    /// `streamResetWindow`; one more: GOAWAY.
    public var maxControlFrames: Int = 200
    /// CONTINUATION frames in a row (CVE-2024-27316: a header block that never ends).
    public var maxSequentialContinuationFrames: Int = 5
    /// Control frames (PING and SETTINGS acknowledgements, RST_STREAM) queued for a client that
    /// does not read; one more: the connection is closed.
    public var maxBufferedControlFrames: Int = 1000

    public init(overTLS: Bool = true, cleartext: Bool = false, maxConcurrentStreams: Int = 100, maxHeaderListSize: Int = 16 * 1024,
                maxStreamResets: Int = 200, streamResetWindow: TimeAmount = .seconds(10)) {
        self.overTLS = overTLS
        self.cleartext = cleartext
        self.maxConcurrentStreams = maxConcurrentStreams
        self.maxHeaderListSize = maxHeaderListSize
        self.maxStreamResets = maxStreamResets
        self.streamResetWindow = streamResetWindow
    }
}

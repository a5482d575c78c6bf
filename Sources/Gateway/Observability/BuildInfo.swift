import Foundation

/// What `sessiongate --version` and `sessiongate_build_info` report.
public enum BuildInfo {
    public static let version = "0.10.0"
    public static var swift: String {
        #if swift(>=6.3)
        return "6.3"
        #elseif swift(>=6.2)
        return "6.2"
        #elseif swift(>=6.1)
        return "6.1"
        #else
        return "6.0"
        #endif
    }
}

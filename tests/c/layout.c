/* Prints the size and field offsets of every boundary struct as the C
 * compiler lays them out; tests/plugin_abi.rs compares them with Rust's. */
#include "m0serve.h"
#include <stddef.h>
#include <stdio.h>

#define S(T) printf(#T " %zu\n", sizeof(T))
#define O(T, f) printf(#T "." #f " %zu\n", offsetof(T, f))

int main(void) {
    S(M0Str); S(M0Header); S(M0SockAddr); S(M0PluginInfo); S(M0Request); S(M0Error); S(M0Host); S(M0InitArgs);
    S(M0PluginCalls);
    O(M0PluginInfo, max_batch); O(M0PluginInfo, max_batch_bytes); O(M0PluginInfo, name); O(M0Request, headers); O(M0Request, content_length);
    O(M0Request, peer); O(M0Request, host_data); O(M0Request, flags); O(M0Request, queued_ns); O(M0Host, log); O(M0Host, counter_add);
    O(M0Host, fact); O(M0Host, response_reason); O(M0Host, set_ready); O(M0InitArgs, arg); O(M0InitArgs, server); O(M0PluginCalls, handle);
    O(M0PluginCalls, shutdown); O(M0PluginCalls, admit); O(M0Error, message); O(M0Host, model_register);
    O(M0Host, request_model); O(M0Host, model_in_flight); O(M0Host, metric_define); O(M0Host, metric_record);
    O(M0InitArgs, args); O(M0InitArgs, arg_count);
    return 0;
}

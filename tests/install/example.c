/* A C99 program built against an installed libparallax (pkg-config or find_package):
 * connects to parallaxd, allreduces a vector, prints the result. Exits 1 on any error. */
#include <parallax_c.h>
#include <stdio.h>

int main(void) {
  px_connect_options options;
  px_connect_options_init(&options); /* socket from $PARALLAX_SOCKET */
  px_client* client = NULL;
  px_status s = px_connect(&options, &client);
  if (s != PX_OK) {
    fprintf(stderr, "px_connect: %s: %s\n", px_status_name(s), px_last_error());
    return 1;
  }
  px_var* var = NULL;
  float in[4] = {1, 2, 3, 4}, out[4] = {0, 0, 0, 0};
  px_request* request = NULL;
  s = px_register_dense(client, "example", PX_F32, 4, PX_SUM, &var);
  if (s == PX_OK) s = px_allreduce(var, in, out, &request);
  if (s == PX_OK) s = px_wait(request, 10000);
  if (s != PX_OK) {
    fprintf(stderr, "%s: %s\n", px_status_name(s),
            request ? px_request_error(request) : px_last_error());
    return 1;
  }
  px_request_free(request);
  printf("ABI %u.%u result %g %g %g %g\n", px_abi_version() >> 16, px_abi_version() & 0xffff,
         out[0], out[1], out[2], out[3]);
  px_disconnect(client);
  return 0;
}

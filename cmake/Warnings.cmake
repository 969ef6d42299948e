# pagoda_warnings: an interface target every module links privately.
add_library(pagoda_warnings INTERFACE)
target_compile_options(pagoda_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${PAGODA_WERROR}>>:-Werror>)

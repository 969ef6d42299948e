# pagoda_warnings: an interface target every module links privately.
# -Wno-missing-field-initializers: config structs are built with designated initialisers that name
# only the fields they change (ARCHITECTURE §4); GCC 12 would warn on every one of them.
add_library(pagoda_warnings INTERFACE)
target_compile_options(pagoda_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers>
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${PAGODA_WERROR}>>:-Werror>)
